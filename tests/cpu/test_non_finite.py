"""A run that went non-finite is a failed run (issue 24, items 6-7): a NaN/Inf validation metric or
model tensor stops `fit` at that epoch naming it, before the epoch's checkpoint is written, so the
last checkpoint stays the last finite one; `save_checkpoint` refuses what `load_checkpoint` would;
`Model.logits` (and so `blueprint predict`) refuses non-finite outputs; `--json` is strict JSON."""
import json

import numpy as np
import pytest

from blueprint import BluePrint, Model, bn, conv, fc, gap, relu, seq
from blueprint.cli import main
from blueprint import InputSpec
from blueprint.optim import SGD, MultiStepLR
from blueprint.task import DeepLearningTask
from blueprint.task import CheckpointIntegrityError, load_checkpoint, save_checkpoint
from blueprint.task import DivergedError
from blueprint.task.data import ArrayDataset

NET = BluePrint(seq(conv(4, 3, 1, 1), bn(), relu(), gap(), fc(2)))
RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 4, 4, 1)).astype(np.float32)
Y = np.arange(8) % 2


def test_a_nan_validation_loss_fails_the_epoch_and_keeps_the_last_finite_checkpoint(tmp_path):
    data = ArrayDataset(X, Y)
    blow_up = MultiStepLR().milestones([1]).gamma(3e38)     # epoch 1 at lr 1, epoch 2 at lr 3e38
    task = (DeepLearningTask().model(NET).optimizer(SGD().lr(1.0)).scheduler(blow_up)
            .data(train=data, val=data, batch_size=8).epochs(2).progress(False).checkpoint(tmp_path / "c.safetensors"))
    with pytest.raises(DivergedError, match="diverged at epoch 2: the validation loss is nan"):
        task.fit()
    tensors, state = load_checkpoint(tmp_path / "c.safetensors")
    assert state["epochs_done"] == 1 and len(state["history"]) == 1
    assert np.isfinite(state["history"][0]["val_loss"])


def test_state_that_went_non_finite_fails_at_that_epoch_naming_the_tensor(tmp_path):
    huge = ArrayDataset((X * 1e38).astype(np.float32), Y)    # the loss stays finite, BN's running_var overflows
    task = (DeepLearningTask().model(NET).optimizer(SGD().lr(0.0)).data(train=huge, batch_size=8, normalize=None)
            .epochs(1).progress(False).checkpoint(tmp_path / "c.safetensors"))
    with pytest.raises(DivergedError, match="epoch 1: model tensor '1.running_var' holds 4 NaN/Inf"):
        task.fit()
    assert not (tmp_path / "c.safetensors").exists()


def test_save_checkpoint_refuses_what_the_loader_refuses_and_keeps_the_previous_file(tmp_path):
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, {"w": np.ones(3, np.float32)}, {"epoch": 1})
    with pytest.raises(CheckpointIntegrityError, match="not saved: tensor 'w' holds 1 NaN/Inf"):
        save_checkpoint(path, {"w": np.array([1, np.inf, 2], np.float32)}, {"epoch": 2})
    tensors, state = load_checkpoint(path)
    assert state == {"epoch": 1} and np.array_equal(tensors["w"], np.ones(3, np.float32))


def test_model_logits_refuse_non_finite_outputs():
    model = Model(NET, InputSpec((4, 4, 1), "float32"))
    assert np.isfinite(model.logits(X)).all()
    x = X.copy()
    x[3] = -3e38                             # one sample overflows to inf logits (seed 0 weights)
    with pytest.raises(ValueError, match=r"not finite \(NaN/Inf\) for 1 of 8 samples \(first: sample 3\)"):
        model.predict(x)


def test_cli_train_that_diverges_exits_2_with_one_line_and_no_json(tmp_path, capsys):
    # one step per epoch (the 1,438 digits in one batch): the step's loss is finite, the validation loss is not
    argv = ["train", "--lr", "3e38", "--batch-size", "1438", "--epochs", "1", "--json", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: training diverged at epoch 1: the validation loss is nan")
    assert not (tmp_path / "run" / "checkpoint.safetensors").exists()


def test_train_json_is_strict(tmp_path, capsys):
    assert main(["train", "--epochs", "1", "--batch-size", "1024", "--json", "--out", str(tmp_path / "run")]) == 0
    metrics = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"{name} in --json"))
    assert np.isfinite(metrics["val_loss"])
