"""The CUDA path's checkpoint carries its loss scale and step counters, and an interrupt checkpoint
resumes with them (the shared validation accepts the `amp.*` entries and refuses bad ones)."""
import numpy as np
import pytest

from blueprint import BluePrint, cbr, gap_fc, seq
from blueprint.optim import SGD
from blueprint.task import DeepLearningTask
from blueprint.task import load_checkpoint
from blueprint.task import interrupt_path
from blueprint.task.data import DataLoader, synthetic
from planner.executor_api import StateError


def _task(train, val):
    return (DeepLearningTask().model(BluePrint(seq(cbr(8, 3, 1, 1), gap_fc(3))))
            .optimizer(SGD().momentum(0.9)).data(train=train, val=val, batch_size=8)
            .epochs(2).device("cuda").seed(0).progress(False))


def test_an_interrupted_cuda_run_resumes_with_its_loss_scale_and_step(tmp_path, monkeypatch):
    train, val = synthetic(24, (4, 4, 1), num_classes=3, seed=0), synthetic(6, (4, 4, 1), num_classes=3, draw=1)
    checkpoint = tmp_path / "checkpoint.safetensors"
    real = DataLoader.batch

    def batch(self, epoch, index, order=None):
        if self.dataset is train and (epoch, index) == (1, 1):
            raise KeyboardInterrupt
        return real(self, epoch, index, order)

    monkeypatch.setattr(DataLoader, "batch", batch)
    task = _task(train, val).checkpoint(checkpoint)
    with pytest.raises(KeyboardInterrupt):
        task.fit()
    monkeypatch.undo()
    tensors, state = load_checkpoint(interrupt_path(checkpoint))
    assert state["position"]["batch"] == 1 and int(tensors["optim.step"]) == 4
    assert {"optim.amp.loss_scale", "optim.amp.step"} <= set(tensors)
    resumed = _task(train, val).resume(interrupt_path(checkpoint))
    ex = resumed.session().executor
    assert ex.step_count == 4 and ex.loss_scale == task.session().executor.loss_scale
    bad = {k[len("optim."):]: v for k, v in tensors.items() if k.startswith("optim.")}
    bad["amp.loss_scale"] = np.array([np.inf], np.float32)
    with pytest.raises(StateError, match="'amp.loss_scale' must be one finite number"):
        ex.load_optimizer_state(bad)
    assert [r.epoch for r in resumed.fit()] == [1, 2]
