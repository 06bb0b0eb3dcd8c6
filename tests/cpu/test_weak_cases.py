"""Issue 24, the weak cases: each mistake (of a user, a disk or a crafted file) is one `error:` line on
stderr and exit status 2 through the CLI, or one ValueError/ConfigError from the API; never a traceback.
One table: (name, how to set it up, the command or call, a fragment of the message)."""
import json
import os

import numpy as np
import pytest

from blueprint.cli import main
from blueprint import ConfigError
from blueprint.task import _checkpoint
from blueprint.task import save_checkpoint

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


CLI_CASES = [
    ("lock file is a folder", lambda t, c: _folder(t / "run" / ".lock") and QUICK + ["--out", str(t / "run")],
     "Is a directory"),
    ("history.jsonl is a folder", lambda t, c: _folder(t / "run" / "history.jsonl") and QUICK + ["--out", str(t / "run")],
     "Is a directory"),
    ("--out under a file", lambda t, c: (t / "file").write_text("x") and QUICK + ["--out", str(t / "file" / "run")],
     "--out"),
    ("--out name too long", lambda t, c: QUICK + ["--out", str(t / ("n" * 300))], "File name too long"),
    ("export --onnx a folder", lambda t, c: ["export", str(c), "--onnx", str(t)], "is a folder"),
    ("predict an .npz", lambda t, c: ["predict", str(c), str(_npz(t))], "not a .npy file of numbers"),
    ("predict a .npy whose header lies", lambda t, c: ["predict", str(c), str(_lying_npy(t))],
     "not a .npy file of numbers"),
    ("predict a FIFO", lambda t, c: ["predict", str(c), str(_fifo(t))], "is not a regular file"),
    ("checkpoint /dev/zero", lambda t, c: ["predict", "/dev/zero", str(_npz(t))], "is not a regular file"),
    ("state is a JSON list", lambda t, c: ["predict", str(_crafted_state(t, [1, 2])), str(_npz(t))],
     "not a blueprint state"),
    ("state nested 100k deep", lambda t, c: ["predict", str(_crafted_state(t, _Nested())), str(_npz(t))],
     "not a blueprint state"),
]


class _Nested:
    """Encodes as JSON nested 100,000 lists deep (json.dumps would recurse: written by hand)."""


_dumps = json.dumps


def _dumps_nested(value, *args, **kwargs):
    return "[" * 100_000 + "]" * 100_000 if isinstance(value, _Nested) else _dumps(value, *args, **kwargs)


@pytest.mark.parametrize("name, make, fragment", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_weak_cases_are_one_error_line(tmp_path, trained, capsys, monkeypatch, name, make, fragment):
    monkeypatch.setattr(_checkpoint.json, "dumps", _dumps_nested)
    argv = make(tmp_path, trained)
    monkeypatch.undo()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err[-1500:]
    assert fragment in lines[0]


def test_api_evaluate_with_labels_past_the_classes_is_a_config_error():
    from blueprint import BluePrint, conv, fc, gap, relu, seq
    from blueprint.optim import SGD
    from blueprint.task import DeepLearningTask
    from blueprint.task.data import ArrayDataset
    x = np.zeros((4, 4, 4, 1), np.float32) + np.arange(4, dtype=np.float32)[:, None, None, None]
    task = (DeepLearningTask().model(BluePrint(seq(conv(2, 3, 1, 1), relu(), gap(), fc(2)))).optimizer(SGD())
            .data(train=ArrayDataset(x, np.arange(4) % 2), batch_size=4).progress(False))
    with pytest.raises(ConfigError, match=r"labels must be in \[0, 2\) .* got values in \[0, 5\]"):
        task.evaluate(ArrayDataset(x, np.array([0, 1, 5, 1])))
