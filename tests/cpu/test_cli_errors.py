"""Every user error of `blueprint train` is one `error: <cause>; <fix>` line on stderr, exit status 2,
no traceback; the same mistakes made through the Python API raise the user-error family
(`ValueError`/`TypeError` subclasses) with a one-line message. A genuine bug keeps its traceback.

The `plan` subcommand's errors (model files, shapes, sizes) are in tests/null/test_cli.py."""
import numpy as np
import pytest

import blueprint._train_command as train_command
from blueprint import BluePrint, cbr, fc, gap, seq
from blueprint.cli import main
from blueprint.task import DeepLearningTask
from blueprint.task.data import ArrayDataset

CIFAR_FILES = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]


def _cifar_folder(folder, records=2, constant_red=False):
    """A tiny CIFAR-10 binary folder: ``records`` random images per file (red plane constant if asked)."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in CIFAR_FILES:
        data = rng.integers(0, 256, (records, 1 + 3072), dtype=np.uint8)
        data[:, 0] %= 10
        if constant_red:
            data[:, 1:1 + 1024] = 7
        data.tofile(folder / name)
    return folder


def _digits_checkpoint(tmp_path):
    out = tmp_path / "digits-run"
    assert main(["train", "--epochs", "1", "--batch-size", "128", "--out", str(out), "--json"]) == 0
    return out / "checkpoint.safetensors"


def _cuda_is_unavailable():
    try:
        from cuda_kernels import cuda_unavailable_reason
    except ImportError:
        return True
    return bool(cuda_unavailable_reason())


CLI_ERRORS = [
    # name, argv (formatted with tmp paths), fragment of the message
    ("cuda without a GPU", ["--device", "cuda"], "train on the CPU with --device cpu"),
    ("diverging lr", ["--lr", "1e30"], "the loss became nan; lower the learning rate"),
    ("--out names a file", ["--out", "{file}"], "is a file, not a folder; pass a folder path"),
    ("resume into another channel count", ["--data", "cifar10:{cifar}", "--resume", "{digits_checkpoint}"],
     "cannot resume: different"),
    ("empty dataset", ["--data", "cifar10:{empty}"], "should hold whole CIFAR-10 binary records"),
    ("constant channel", ["--data", "cifar10:{constant}"], "channel 0 of the training data is constant"),
    ("unknown data", ["--data", "mnist"], "--data: expected digits, synthetic, cifar10:PATH or folder:PATH"),
    ("unknown model", ["--model", "resnet21"], "unknown model 'resnet21'"),
]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")   # the diverging run, before its
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # loss check catches the NaN
@pytest.mark.parametrize("name, argv, fragment", CLI_ERRORS, ids=[c[0] for c in CLI_ERRORS])
def test_train_user_errors_are_one_line_exit_2(tmp_path, capsys, name, argv, fragment):
    if name == "cuda without a GPU" and not _cuda_is_unavailable():
        pytest.skip("a GPU (or the CUDA simulator) is available here, so --device cuda is no error")
    paths = {"file": tmp_path / "a-file", "cifar": tmp_path / "cifar", "empty": tmp_path / "empty",
             "constant": tmp_path / "constant"}
    paths["file"].write_text("not a folder")
    _cifar_folder(paths["cifar"])
    _cifar_folder(paths["empty"], records=0)
    _cifar_folder(paths["constant"], constant_red=True)
    if "{digits_checkpoint}" in argv:
        paths["digits_checkpoint"] = _digits_checkpoint(tmp_path)
        capsys.readouterr()
    argv = [a.format(**paths) for a in argv]
    out_args = [] if "--out" in argv else ["--out", str(tmp_path / "run")]
    status = main(["train", "--epochs", "1", "--batch-size", "64", *out_args, *argv])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and fragment in error_lines[0], err
    assert err.rstrip().endswith(error_lines[0])


def _tiny_task(x, y, **data):
    bp = BluePrint(seq(cbr(4, 3, 1, 1), gap(), fc(2)))
    return DeepLearningTask().model(bp).data(train=ArrayDataset(x, y), batch_size=4, **data).epochs(1).progress(False)


X = np.random.default_rng(0).standard_normal((8, 4, 4, 2)).astype(np.float32)
Y = np.arange(8) % 2


def _with(index, value):
    x = X.copy()
    x[index] = value
    return x


API_ERRORS = [
    ("NaN in the data", lambda: _tiny_task(_with((3, 1, 1, 0), np.nan), Y).fit(),
     "the data contains NaN (first at image 3, pixel (1, 1), channel 0)"),
    ("Inf in the data", lambda: _tiny_task(_with((5, 0, 2, 1), np.inf), Y).fit(), "the data contains Inf"),
    ("empty dataset", lambda: _tiny_task(X[:0], Y[:0]).fit(), "is empty"),
    ("constant channel", lambda: _tiny_task(_with((slice(None), slice(None), slice(None), 1), 0.5), Y).fit(),
     "channel 1 of the training data is constant"),
    ("normalize='bogus'", lambda: _tiny_task(X, Y, normalize="bogus"), "expected 'auto'"),
]


@pytest.mark.parametrize("name, make, fragment", API_ERRORS, ids=[c[0] for c in API_ERRORS])
def test_data_mistakes_raise_one_line_user_errors(name, make, fragment):
    with pytest.raises((ValueError, TypeError)) as caught:
        make()
    message = str(caught.value)
    assert fragment in message and "\n" not in message


@pytest.mark.parametrize("name, make, fragment", API_ERRORS, ids=[c[0] for c in API_ERRORS])
def test_data_mistakes_reach_the_cli_as_one_error_line(monkeypatch, tmp_path, capsys, name, make, fragment):
    """The same mistakes arriving through `blueprint train` (its data source swapped for the bad set)."""
    def load_bad_data(spec, options=None):
        try:
            make()
        except (ValueError, TypeError):
            raise
        raise AssertionError("expected an error")
    monkeypatch.setattr(train_command, "load_data", load_bad_data)
    assert main(["train", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines() == [err.strip().splitlines()[-1]]
    assert err.startswith("error: ") and fragment in err


def test_a_bug_keeps_its_traceback(monkeypatch, tmp_path):
    """Only the user-error family becomes one line: an unexpected exception propagates."""
    def broken(spec, options=None):
        raise ZeroDivisionError("a bug")
    monkeypatch.setattr(train_command, "load_data", broken)
    with pytest.raises(ZeroDivisionError):
        main(["train", "--out", str(tmp_path / "run")])

