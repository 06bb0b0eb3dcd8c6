"""Issue 24, the weak cases: each mistake (of a user, a disk, a crafted file or the launch environment) is
one `error:` line on stderr and exit status 2 through the CLI, or one ValueError/ConfigError from the API;
never a traceback. Three tables: the CLI's (name, the command line, a fragment of the message, the
environment), the file-system faults of `blueprint train` (name, the fault, a fragment of the message, what the
run folder keeps) and the API's (name, the call, the error, a pattern of its message)."""
import errno
import importlib.util
import itertools
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from blueprint.cli import main
from blueprint import ConfigError
from blueprint import _run_folder
from blueprint.task import _checkpoint
from blueprint.task import load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[2]

QUICK = ["train", "--epochs", "1", "--batch-size", "1024", "--quiet"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "run"
    assert main(QUICK + ["--out", str(out)]) == 0
    return out / "checkpoint.safetensors"


def _crafted_state(tmp_path, encoded):
    """A checkpoint whose state JSON is `encoded` (digests valid: written through save_checkpoint)."""
    path = tmp_path / "crafted.safetensors"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_checkpoint, "_encode", lambda value, where: encoded)
        save_checkpoint(path, {}, {})
    return path


def _fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    return tmp_path / "fifo"


def _lying_npy(tmp_path):
    path = tmp_path / "lying.npy"
    np.save(path, np.zeros((2, 8, 8, 1), np.float32))
    raw = path.read_bytes().replace(b"(2, 8, 8, 1)", b"(9, 8, 8, 1)")
    path.write_bytes(raw)
    return path


def _npz(tmp_path):
    np.savez(tmp_path / "x.npz", x=np.zeros((1, 8, 8, 1), np.float32))
    return tmp_path / "x.npz"


def _folder(path):
    path.mkdir(parents=True)
    return path


def _foreign_dtype(tmp_path, dtype, itemsize):
    """A safetensors file whose one tensor, 8 bytes, has ``dtype`` (BF16, F8_E4M3: types numpy has not), written
    by hand: an 8-byte little-endian header length, the JSON header, the data."""
    header = json.dumps({"model.w": {"dtype": dtype, "shape": [8 // itemsize], "data_offsets": [0, 8]},
                         "__metadata__": {_checkpoint.STATE_KEY: "{}", _checkpoint.FORMAT_KEY: "2"}}).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / f"{dtype}.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    return path


def _epochs_done(tmp_path, checkpoint, epochs_done):
    """``checkpoint`` with its state's epochs_done replaced (digests valid: written through save_checkpoint)."""
    tensors, state = load_checkpoint(checkpoint)
    path = tmp_path / "edited.safetensors"
    save_checkpoint(path, tensors, {**state, "epochs_done": epochs_done})
    return path


def _torchrun_environment(world_size, port):
    return {"RANK": "0", "WORLD_SIZE": world_size, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


class Case(NamedTuple):
    name: str
    make: Callable            # (tmp_path, a trained checkpoint) -> the command line
    fragment: str             # in the error line
    environment: Callable = lambda busy_port: {}   # variables set for the run; busy_port: a port held by a listener


CLI_CASES = [
    Case("lock file is a folder", lambda t, c: _folder(t / "run" / ".lock") and QUICK + ["--out", str(t / "run")],
         "Is a directory"),
    Case("history.jsonl is a folder",
         lambda t, c: _folder(t / "run" / "history.jsonl") and QUICK + ["--out", str(t / "run")],
         "Is a directory"),
    Case("--out under a file", lambda t, c: (t / "file").write_text("x") and QUICK + ["--out", str(t / "file" / "run")],
         "--out"),
    Case("--out name too long", lambda t, c: QUICK + ["--out", str(t / ("n" * 300))], "File name too long"),
    Case("export --onnx a folder", lambda t, c: ["export", str(c), "--onnx", str(t)], "is a folder"),
    Case("predict an .npz", lambda t, c: ["predict", str(c), str(_npz(t))], "not a .npy file of numbers"),
    Case("predict a .npy whose header lies", lambda t, c: ["predict", str(c), str(_lying_npy(t))],
         "not a .npy file of numbers"),
    Case("predict a FIFO", lambda t, c: ["predict", str(c), str(_fifo(t))], "is not a regular file"),
    Case("checkpoint /dev/zero", lambda t, c: ["predict", "/dev/zero", str(_npz(t))], "is not a regular file"),
    Case("state is a JSON list", lambda t, c: ["predict", str(_crafted_state(t, [1, 2])), str(_npz(t))],
         "not a blueprint state"),
    Case("state nested 100k deep", lambda t, c: ["predict", str(_crafted_state(t, _Nested())), str(_npz(t))],
         "not a blueprint state"),
    Case("checkpoint with BF16 tensors", lambda t, c: ["predict", str(_foreign_dtype(t, "BF16", 2)), str(_npz(t))],
         "tensor 'model.w' has dtype BF16, which numpy cannot hold"),
    Case("checkpoint with F8_E4M3 tensors", lambda t, c: ["predict", str(_foreign_dtype(t, "F8_E4M3", 1)), str(_npz(t))],
         "tensor 'model.w' has dtype F8_E4M3, which numpy cannot hold"),
    Case("resume a checkpoint whose epochs_done is 10**30",
         lambda t, c: QUICK + ["--out", str(t / "run"), "--resume", str(_epochs_done(t, c, 10**30))],
         "epochs_done is 1,000,000,000,000,000,000,000,000,000,000 but its history holds 1 epoch record(s)"),
]
TORCHRUN_CASES = [   # a worker started with torchrun's environment variables, by hand or by another launcher
    Case("WORLD_SIZE=0", lambda t, c: QUICK + ["--out", str(t / "run")],
         "environment variable WORLD_SIZE must be an int >= 1, found '0'", lambda p: _torchrun_environment("0", p)),
    Case("WORLD_SIZE=abc", lambda t, c: QUICK + ["--out", str(t / "run")],
         "environment variable WORLD_SIZE must be an int >= 1, found 'abc'", lambda p: _torchrun_environment("abc", p)),
    Case("MASTER_PORT in use", lambda t, c: QUICK + ["--out", str(t / "run")],
         "another process holds that port", lambda p: _torchrun_environment("1", p)),
]
NEEDS_TORCH = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torchrun's environment is read by blueprint.distributed (torch.distributed)")


class _Nested:
    """Encodes as JSON nested 100,000 lists deep (json.dumps would recurse: written by hand)."""


_dumps = json.dumps


def _dumps_nested(value, *args, **kwargs):
    return "[" * 100_000 + "]" * 100_000 if isinstance(value, _Nested) else _dumps(value, *args, **kwargs)


@pytest.fixture
def busy_port():
    """A port held by a listener that never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        yield listener.getsockname()[1]


@pytest.mark.parametrize("case", CLI_CASES + [pytest.param(c, marks=NEEDS_TORCH) for c in TORCHRUN_CASES],
                         ids=[c.name for c in CLI_CASES + TORCHRUN_CASES])
def test_cli_weak_cases_are_one_error_line(tmp_path, trained, capsys, monkeypatch, busy_port, case):
    monkeypatch.setattr(_checkpoint.json, "dumps", _dumps_nested)
    argv = case.make(tmp_path, trained)
    monkeypatch.undo()
    for name, value in case.environment(busy_port).items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err[-1500:]
    assert case.fragment in lines[0]


class _RefusingFile:
    """A file whose writes fail as a full disk's or a read-only file system's do: OSError(code), no file name
    (a write's error names none), nothing written."""

    def __init__(self, handle, code: int):
        self._handle, self._code = handle, code

    def write(self, data):
        raise OSError(self._code, os.strerror(self._code))

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self._handle.close()


def _in(folder: Path, path) -> bool:
    return Path(path).resolve().parent == folder.resolve()


def _checkpoint_write_fails(nth: int, code: int):
    """The ``nth`` checkpoint save into the run folder fails at its first write (the saver writes its temporary
    file through os.fdopen)."""
    def install(monkeypatch, out: Path):
        saves, fdopen = itertools.count(1), os.fdopen

        def refusing_fdopen(descriptor, *args, **kwargs):
            handle = fdopen(descriptor, *args, **kwargs)
            if _in(out, os.readlink(f"/proc/self/fd/{descriptor}")) and next(saves) == nth:
                return _RefusingFile(handle, code)
            return handle
        monkeypatch.setattr(os, "fdopen", refusing_fdopen)
    return install


def _history_write_fails(nth: int, code: int):
    """The ``nth`` append to OUT/history.jsonl fails at its write."""
    def install(monkeypatch, out: Path):
        appends = itertools.count(1)

        def refusing_open(path, *args, **kwargs):
            handle = open(path, *args, **kwargs)
            return _RefusingFile(handle, code) if next(appends) == nth else handle
        monkeypatch.setattr(_run_folder, "open", refusing_open, raising=False)
    return install


def _read_only(monkeypatch, out: Path):
    """Every open for writing in the run folder fails as on a read-only file system (the first is the run's lock;
    root ignores chmod and mounting is not ours to do, so the file system's answer is imitated)."""
    os_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and _in(out, path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return os_open(path, flags, *args, **kwargs)
    monkeypatch.setattr(os, "open", refusing_open)


class FaultCase(NamedTuple):
    name: str
    install: Callable         # (monkeypatch, the run folder) -> None: makes a write of the run fail
    pattern: str              # of the error line
    earlier_run: bool         # OUT holds an earlier 1-epoch run, which must stay byte for byte; else OUT is new
    epochs_kept: int          # the epochs the run folder's checkpoint holds afterwards
    history_lines: int        # the lines history.jsonl holds afterwards


FAULT_CASES = [   # the run trains 2 epochs; each epoch saves the checkpoint, then appends its history line
    FaultCase("disk full at the second checkpoint save", _checkpoint_write_fails(2, errno.ENOSPC),
              r"No space left on device \(\S+/run/checkpoint\.safetensors\); nothing of the previous checkpoint was lost",
              False, 1, 1),
    FaultCase("disk full at the second history line", _history_write_fails(2, errno.ENOSPC),
              r"No space left on device \(\S+/run/history\.jsonl\); nothing of the previous checkpoint was lost",
              False, 2, 1),
    FaultCase("read-only run folder", _read_only, r"Read-only file system \(\S+/run/\.lock\)", True, 1, 1),
]


@pytest.mark.parametrize("case", FAULT_CASES, ids=[c.name for c in FAULT_CASES])
def test_train_file_system_faults_are_one_error_line(tmp_path, capsys, monkeypatch, case):
    """A full disk or a read-only run folder in the middle of `blueprint train`: one error line, exit 2, and the
    run folder keeps a loadable checkpoint and whole history lines (the last written before the fault)."""
    out = tmp_path / "run"
    if case.earlier_run:
        assert main(QUICK + ["--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()} if case.earlier_run else None
    capsys.readouterr()
    case.install(monkeypatch, out)
    status = main(["train", "--epochs", "2", "--batch-size", "1024", "--quiet", "--out", str(out)])
    monkeypatch.undo()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err[-1500:]
    assert re.search(case.pattern, lines[0]), lines[0]
    _, state = load_checkpoint(out / "checkpoint.safetensors")
    assert state["epochs_done"] == case.epochs_kept
    history = (out / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in history] == list(range(1, case.history_lines + 1))
    assert not [p.name for p in out.iterdir() if p.name.endswith((".tmp", ".lock"))]   # nothing left behind
    if case.earlier_run:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before


ENDED_WITHIN_S = 150   # generous: only whether the run ended decides, never how fast


@NEEDS_TORCH
def test_a_rank_whose_master_never_answers_is_one_error_line(tmp_path, busy_port):
    """Rank 1 of a run another launcher started, whose MASTER_ADDR:MASTER_PORT accepts and never answers: torch's
    store client blocks past its own timeout; the process-group start's watchdog ends the run with one line.
    A subprocess: the watchdog ends the whole process."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(busy_port)}
    done = subprocess.run([sys.executable, "-m", "blueprint", *QUICK, "--timeout", "2", "--out", str(tmp_path / "run")],
                          env=environment, capture_output=True, text=True, timeout=ENDED_WITHIN_S, cwd=tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-1500:]
    assert lines[0].startswith(f"error: rank 1 of 2: the process group at MASTER_ADDR:MASTER_PORT 127.0.0.1:{busy_port} "
                               "did not start within the timeout of 2 s: rank 0 (the master) did not answer there"), lines[0]
    assert lines[0].endswith("or raise the timeout (blueprint train --timeout, distributed(timeout_s=...))")
    assert not (tmp_path / "run").exists()


def _tiny_task(labels=None):
    from blueprint import BluePrint, conv, fc, gap, relu, seq
    from blueprint.optim import SGD
    from blueprint.task import DeepLearningTask
    from blueprint.task.data import ArrayDataset
    x = np.zeros((4, 4, 4, 1), np.float32) + np.arange(4, dtype=np.float32)[:, None, None, None]
    return (DeepLearningTask().model(BluePrint(seq(conv(2, 3, 1, 1), relu(), gap(), fc(2)))).optimizer(SGD())
            .data(train=ArrayDataset(x, np.arange(4) % 2), batch_size=4).progress(False).epochs(1))


def _evaluate_labels_past_the_classes(tmp_path):
    from blueprint.task.data import ArrayDataset
    task = _tiny_task()
    task.evaluate(ArrayDataset(task.train_set.x, np.array([0, 1, 5, 1])))


def _resume_epochs_done(tmp_path):
    trained = _tiny_task().checkpoint(tmp_path / "c.safetensors")
    trained.fit()
    _tiny_task().resume(_epochs_done(tmp_path, tmp_path / "c.safetensors", 10**30)).fit()


HOLD_THE_LOCK = """import sys, time
from blueprint.task._checkpoint import checkpoint_lock
with checkpoint_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def _while_another_process_holds(tmp_path, call):
    """``call(checkpoint path)`` while a second process is saving to that path (it holds the checkpoint's lock)."""
    path = tmp_path / "c.safetensors"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(path)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline() == "held\n"
        call(path)
    finally:
        holder.kill()
        holder.wait()
    assert not path.exists()     # nothing overwritten


def _fit_into(path):
    task = _tiny_task().checkpoint(path)
    try:
        task.fit()
    finally:
        assert task.history == [], "refused only after an epoch was trained"   # at the start, not at the first save


API_CASES = [
    ("evaluate() with labels past the classes", _evaluate_labels_past_the_classes, ConfigError,
     r"labels must be in \[0, 2\) .* got values in \[0, 5\]"),
    ("resume a checkpoint whose epochs_done is 10**30", _resume_epochs_done, ConfigError,
     r"epochs_done is 1,000(,000)* but its history holds 1 epoch record"),
    ("save() to a checkpoint another process is saving to",
     lambda t: _while_another_process_holds(t, lambda path: _tiny_task().save(path)), ConfigError,
     r"c.safetensors is being written by another process \(pid \d+\)"),
    ("fit() into a checkpoint another process is saving to",
     lambda t: _while_another_process_holds(t, _fit_into), ConfigError,
     r"c.safetensors is being written by another process \(pid \d+\)"),
]


@pytest.mark.parametrize("name, call, error, pattern", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_weak_cases_are_one_clear_error(tmp_path, name, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(tmp_path)
