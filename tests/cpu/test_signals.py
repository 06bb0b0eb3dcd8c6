"""Issue 24 item 11: SIGTERM is handled as Ctrl-C is (position saved, the run folder's lock released,
exit status 143), and `--timeout` sets the workers' collective timeout. No test depends on timing: the
signal is sent by the run itself at a fixed point (after epoch 1's history line)."""
import os
import signal


import blueprint._train_command as train_command
from blueprint.cli import build_parser, main
from blueprint._launch import worker_arguments
from blueprint._run_folder import LOCK_NAME
from blueprint.task import load_checkpoint


def test_sigterm_saves_the_position_releases_the_lock_and_exits_143(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    append = train_command.append_history

    def append_then_terminate(folder, run_id, record):
        append(folder, run_id, record)
        os.kill(os.getpid(), signal.SIGTERM)       # as `kill PID` would, at a fixed point of the run
    monkeypatch.setattr(train_command, "append_history", append_then_terminate)
    previous = signal.getsignal(signal.SIGTERM)
    status = main(["train", "--epochs", "3", "--batch-size", "512", "--quiet", "--out", str(out)])
    assert status == 143
    assert signal.getsignal(signal.SIGTERM) is previous          # the handler is put back
    assert not (out / LOCK_NAME).exists()
    assert "interrupted" in capsys.readouterr().err
    assert load_checkpoint(out / "checkpoint.safetensors")[1]["epochs_done"] == 1


def test_timeout_reaches_the_workers_and_must_be_positive(capsys):
    parser = build_parser()
    args = parser.parse_args(["train", "--nproc-per-node", "2", "--timeout", "7.5"])
    command = args.train_command
    argv = worker_arguments(command, args)
    assert argv[argv.index("--timeout") + 1] == "7.5" and "--nproc-per-node" not in argv
    for bad in ("0", "-1", "nan", "inf", "soon"):
        assert main(["train", "--timeout", bad]) == 2
        assert "expected a number of seconds > 0" in capsys.readouterr().err
