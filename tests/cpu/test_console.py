"""What fit() and `blueprint train` print: one line per epoch when stderr is not a terminal, a bar
redrawn per batch only on a terminal, a one-time compile notice, nothing with --quiet."""
import io
import re
import sys

import numba
import pytest

from blueprint import BluePrint, cbr, fc, gap, seq
from blueprint.cli import main
from blueprint.optim import SGD
from blueprint.task import DeepLearningTask
from blueprint.task import EpochRecord
from blueprint.task._console import COMPILE_NOTICE, CompileWatch, Console, epoch_line
from blueprint.task.data import ArrayDataset, digits

EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+)  (\d+)/\3  [\d.]+s  loss [\d.]+  acc [\d.]+  val_loss [\d.]+  "
                        r"val_acc [\d.]+  \d+ img/s  lr [\d.e-]+(  \(compiling kernels took [\d.]+s, not counted in img/s\))?$")


@pytest.fixture
def task():
    train, val = digits()
    return (DeepLearningTask(model=BluePrint(seq(cbr(8, 3, 1, 1), gap(), fc(10))), optimizer=SGD(lr=0.1), seed=0)
            .data(train=ArrayDataset(train.x[:200], train.y[:200]), val=ArrayDataset(val.x[:64], val.y[:64]),
                  batch_size=64))


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_captured_output_gets_one_line_per_epoch_and_no_bar(task, capsys):
    history = task.fit(epochs=3)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line != COMPILE_NOTICE]
    assert out == "" and "\r" not in err and len(history) == 3
    assert [EPOCH_LINE.match(line).group(1, 2, 3) for line in lines] == [("1", "3", "4"), ("2", "3", "4"),
                                                                         ("3", "3", "4")]
    assert f"val_acc {history[-1].val_accuracy:.4f}" in lines[-1] and f"loss {history[0].train_loss:.4f}" in lines[0]


def test_fit_epochs_counts_the_total_and_trains_this_task(task):
    assert len(task.fit(epochs=2)) == 2 and len(task.history) == 2       # the session stays with `task`
    assert [r.epoch for r in task.fit(epochs=3)] == [1, 2, 3]               # one more epoch, not three
    assert task.epoch_count == 1                                            # the value itself is unchanged


def test_a_terminal_gets_a_bar_per_batch_replaced_by_the_epoch_line(task, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    task.fit(epochs=1)
    text = terminal.getvalue()
    assert "\r" in text and "batch" in text            # tqdm's redraws
    assert EPOCH_LINE.match(text.rsplit("\r", 1)[-1].rstrip("\n")) is not None   # after the cleared bar


def test_progress_false_prints_nothing(task, capsys):
    task.progress(False).fit(epochs=1)
    assert capsys.readouterr() == ("", "")


def test_a_compile_is_announced_once_and_timed():
    stream = io.StringIO()
    with Console(True, stream) as console:
        console.begin_epoch(1, 0, "epoch 1/1")
        for offset in (1, 2):                          # two fresh functions: two compilations, one notice
            numba.njit(lambda x, k=offset: x + k)(1)
        seconds = console.epoch_compile_seconds()
    assert stream.getvalue() == COMPILE_NOTICE + "\n" and seconds > 0


def test_nothing_compiled_means_no_notice_and_zero_seconds():
    function = numba.njit(lambda x: x * 2)
    function(1)                                         # compiled before the watch starts
    with CompileWatch(lambda: pytest.fail("notice for a function already compiled")) as watch:
        function(2)
    assert (watch.compiled, watch.seconds) == (False, 0.0)


def test_the_epoch_line_names_the_compile_time_it_left_out():
    record = EpochRecord(2, 0.05, 0.5, 0.8, 0.4, 0.9, None, 3.25, 1234.4)
    assert epoch_line(record, 8, 45) == ("epoch 2/8  45/45  3.2s  loss 0.5000  acc 0.8000  val_loss 0.4000  "
                                         "val_acc 0.9000  1234 img/s  lr 0.05")
    assert epoch_line(record, 8, 45, 21.7).endswith("(compiling kernels took 21.7s, not counted in img/s)")


@pytest.mark.parametrize("flags, expect_lines", [([], 1), (["--quiet"], 0)])
def test_cli_train_prints_epoch_lines_unless_quiet(tmp_path, capsys, monkeypatch, flags, expect_lines):
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # no plot: its notice is printed unless --quiet
    assert main(["train", "--epochs", "1", "--out", str(tmp_path / "run")] + flags) == 0
    out, err = capsys.readouterr()
    assert len([line for line in err.splitlines() if EPOCH_LINE.match(line)]) == expect_lines
    assert "trained small_cnn on digits: 1 epoch in" in out and "\r" not in err
    assert (COMPILE_NOTICE in err) <= (not flags)        # --quiet: no notice either
    assert ("notice: matplotlib is not installed" in err) == (not flags)
    if flags:
        assert err == "", "--quiet writes nothing to stderr"
