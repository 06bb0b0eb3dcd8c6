"""`blueprint train --out`: one run per folder (a lock naming its holder), history appended per run,
and a run that fails before its first step leaves the file system as it found it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blueprint.cli import main
from blueprint._run_folder import LOCK_NAME, run_folder

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["train", "--epochs", "1", "--batch-size", "128", "--json"]


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.exists() else None


def _history(folder):
    return [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]


def test_a_second_run_into_a_locked_folder_is_refused_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "run"
    with run_folder(out):
        before = _snapshot(out)
        assert main(QUICK + ["--out", str(out)]) == 2
        assert _snapshot(out) == before
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and f"in use by another run (pid {os.getpid()})" in error and "--out" in error
    assert not out.exists(), "the lock's own folder is removed again: nothing was written into it"


def test_a_dead_runs_lock_is_taken_over_and_runs_append_their_history(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / LOCK_NAME).write_text(dead.stdout)          # a killed run's lock file: its flock died with it
    assert main(QUICK + ["--out", str(out)]) == 0
    first = _history(out)
    first_checkpoint = (out / "checkpoint.safetensors").read_bytes()
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["kept"] == []
    assert main(QUICK + ["--out", str(out)]) == 0
    both = _history(out)
    assert both[:len(first)] == first, "a new run rewrote the earlier history"
    assert len(both) == 2 and both[0]["run"] != both[1]["run"] and both[1]["epoch"] == 1
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["run"] == both[1]["run"]
    assert not (out / LOCK_NAME).exists()
    # the second (fresh) run replaced checkpoint.safetensors: the first run's is kept under a second name
    [kept] = [Path(k) for k in result["kept"]]
    assert kept.parent == out and kept.name.startswith("checkpoint.") and kept.read_bytes() == first_checkpoint
    assert (out / "checkpoint.safetensors").read_bytes() != first_checkpoint
    assert main(QUICK + ["--out", str(out), "--epochs", "2", "--resume", str(out / "checkpoint.safetensors")]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["kept"] == [], "a resumed run is the same run"


@pytest.mark.parametrize("existing", [False, True], ids=["new folder", "folder of an earlier run"])
def test_a_run_that_fails_before_its_first_step_leaves_the_folder_as_it_was(tmp_path, capsys, existing):
    out = tmp_path / "runs" / "a"
    if existing:
        out.mkdir(parents=True)
        (out / "history.jsonl").write_text('{"run": "earlier", "epoch": 1}\n')
    before = _snapshot(out)
    assert main(QUICK + ["--out", str(out), "--resume", str(tmp_path / "missing.safetensors")]) == 2
    assert "missing.safetensors does not exist" in capsys.readouterr().err
    assert _snapshot(out) == before
    assert (tmp_path / "runs").exists() == existing, "an empty folder was left behind"


def test_out_naming_a_file_is_a_one_line_error(tmp_path, capsys):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    assert main(QUICK + ["--out", str(target)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: --out") and "is a file" in error and "\n" not in error
    assert target.read_text() == "keep me"


def test_resume_with_another_optimizer_is_refused_and_changes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(QUICK + ["--out", str(out)]) == 0
    before = _snapshot(out)
    checkpoint = out / "checkpoint.safetensors"
    assert main(QUICK + ["--out", str(out), "--optimizer", "adamw", "--resume", str(checkpoint)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "different optimizer kind: the checkpoint has SGD, this task has AdamW" in error and "--optimizer sgd" in error
    assert _snapshot(out) == before
    assert main(QUICK[:2] + ["2"] + QUICK[3:] + ["--out", str(out), "--resume", str(checkpoint)]) == 0   # the fix works
    assert [r["epoch"] for r in _history(out)] == [1, 2]


def test_resume_with_no_epochs_left_is_refused_and_changes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(QUICK[:2] + ["2"] + QUICK[3:] + ["--out", str(out)]) == 0
    before = _snapshot(out)
    checkpoint = out / "checkpoint.safetensors"
    for epochs in ("1", "2"):   # --epochs is the total: neither trains anything
        capsys.readouterr()
        assert main(QUICK[:2] + [epochs] + QUICK[3:] + ["--out", str(out), "--resume", str(checkpoint)]) == 2
        error = capsys.readouterr().err.strip()
        assert "\n" not in error and f"has done 2 epochs and --epochs {epochs} is the total" in error
        assert "pass --epochs 3 or more" in error
        assert _snapshot(out) == before


def test_ctrl_c_of_a_real_run_then_resume_matches_a_straight_run(tmp_path):
    """SIGINT to a `blueprint train` process mid-run (after its first epoch): exit 130, the interrupt
    checkpoint beside the epoch checkpoint, and --resume ends bit-identical to a run never stopped."""
    import time

    import numpy as np

    from blueprint.task import load_checkpoint

    epochs = ["--epochs", "6", "--batch-size", "128", "--json"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    command = [sys.executable, "-m", "blueprint", "train"] + epochs
    process = subprocess.Popen(command + ["--out", str(stopped)], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    while process.poll() is None and not ((stopped / "history.jsonl").exists()
                                          and (stopped / "history.jsonl").read_text().count("\n") >= 1):
        time.sleep(0.05)
    process.send_signal(2)
    _, err = process.communicate(timeout=600)
    if process.returncode == 0:
        pytest.skip("the run finished before the signal arrived (a very fast machine): nothing to resume")
    assert process.returncode == 130, err
    interrupted = stopped / "checkpoint.interrupted.safetensors"
    assert interrupted.exists() and "--resume" in err
    assert load_checkpoint(stopped / "checkpoint.safetensors")[1]["position"] is None
    resumed = subprocess.run(command + ["--out", str(stopped), "--resume", str(interrupted)], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert subprocess.run(command + ["--out", str(straight)], cwd=ROOT, capture_output=True, timeout=600).returncode == 0
    (a, state_a), (b, state_b) = load_checkpoint(straight / "checkpoint.safetensors"), load_checkpoint(
        stopped / "checkpoint.safetensors")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    timing = ("seconds", "images_per_second")
    assert [{k: v for k, v in r.items() if k not in timing} for r in state_a["history"]] == \
        [{k: v for k, v in r.items() if k not in timing} for r in state_b["history"]]
    runs = [r["run"] for r in _history(stopped)]
    assert len(set(runs)) == 2 and [r["epoch"] for r in _history(stopped)] == list(range(1, 7))


def test_resume_restores_the_history_line_a_kill_after_the_save_lost(tmp_path, capsys):
    """Issue 24 item 10: killed between an epoch's checkpoint save and its history append, the run lost that
    epoch's line; the resumed run appends it from the checkpoint's own history before training on."""
    out = tmp_path / "run"
    assert main(QUICK + ["--out", str(out)]) == 0
    [line] = _history(out)
    (out / "history.jsonl").write_text('{"run": "cut sho')      # the kill: the line lost, a torn write left
    checkpoint = str(out / "checkpoint.safetensors")
    assert main(QUICK + ["--out", str(out), "--epochs", "2", "--resume", checkpoint]) == 0
    capsys.readouterr()
    torn, *lines = (out / "history.jsonl").read_text().splitlines()
    assert torn == '{"run": "cut sho'                               # kept as it was: nothing is rewritten
    restored, second = map(json.loads, lines)
    assert {k: v for k, v in restored.items() if k not in ("run", "seconds", "images_per_second")} == \
        {k: v for k, v in line.items() if k not in ("run", "seconds", "images_per_second")}
    assert second["epoch"] == 2
