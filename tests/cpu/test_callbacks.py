"""Callbacks that act: EarlyStopping, ModelCheckpoint, StopTraining, and ReduceLROnPlateau as a
schedule. Their decisions are checked against rules written out here, and an interrupted run is
compared with an uninterrupted one at identical inputs in this process (same code, same machine:
bit-identity is the contract, as in test_resume.py)."""
import math

import pytest

from blueprint import BluePrint, cbr, fc, gap, seq
from blueprint.optim import SGD, ReduceLROnPlateau
from blueprint.task import ConfigError, DeepLearningTask, EarlyStopping, ModelCheckpoint, StopTraining
from blueprint.task import load_checkpoint
from blueprint.task import interrupt_path
from blueprint.task.data import ArrayDataset, DataLoader, digits

TRAIN, VAL, BATCH = 128, 64, 32      # 4 train steps, 2 val batches per epoch


@pytest.fixture(scope="module")
def sets():
    train, val = digits()
    return ArrayDataset(train.x[:TRAIN], train.y[:TRAIN]), ArrayDataset(val.x[:VAL], val.y[:VAL])


def _record(epoch, **values):
    base = {"epoch": epoch, "val_loss": None, "val_accuracy": None, "train_loss": 1.0}
    return {**base, **values}


# (patience, min_delta, mode, monitor, values, epoch it stops at (None: never), best epoch)
EARLY = [
    (2, 0.0, "auto", "val_loss", [1.0, 0.9, 0.95, 0.91, 0.5], 4, 2),
    (2, 0.1, "auto", "val_loss", [1.0, 0.95, 0.91, 0.8], 3, 1),          # 0.95, 0.91: within min_delta of 1.0
    (1, 0.0, "auto", "val_accuracy", [0.1, 0.2, 0.2, 0.3], 3, 2),        # equal is not better
    (3, 0.0, "max", "val_loss", [1.0, 0.9, 0.8, 1.1, 1.0], None, 4),    # mode max on a loss: rises are improvements
    (2, 0.0, "auto", "val_loss", [math.nan, 1.0, 1.0, 1.0], 4, 2),          # NaN never improves
]


@pytest.mark.parametrize("patience, delta, mode, monitor, values, stops, best", EARLY)
def test_early_stopping_follows_patience_min_delta_and_mode(patience, delta, mode, monitor, values, stops, best):
    callback = EarlyStopping(monitor, patience=patience, min_delta=delta, mode=mode)
    state, stopped_at = callback.initial_state(), None
    for epoch, value in enumerate(values, 1):
        outcome = callback.after_epoch(state, _record(epoch, **{monitor: value}), dict)
        state = outcome.state
        if outcome.stop:
            stopped_at = epoch
            break
    assert (stopped_at, state["best_epoch"]) == (stops, best)


def test_model_checkpoint_ranks_by_the_monitor_and_keeps_n():
    callback = ModelCheckpoint("val_loss", keep=2)
    state, on_disk = callback.initial_state(), set()
    for epoch, loss in enumerate([0.5, 0.7, 0.4, 0.45, 0.45, 0.9], 1):
        outcome = callback.after_epoch(state, _record(epoch, val_loss=loss), dict)
        state = outcome.state
        on_disk = (on_disk | ({outcome.write} if outcome.write else set())) - set(outcome.remove)
    # 0.4, and the first 0.45 (a tie keeps the earlier)
    assert on_disk == {"best-epoch003.safetensors", "best-epoch004.safetensors"}


def _model():
    return BluePrint(seq(cbr(4, 3, 1, 1), gap(), fc(10)))


def _task(sets, folder, epochs=5):
    """A plateau cut after every epoch past the first (a 50% relative threshold), an early stop at
    epoch 3 (nothing beats epoch 1 by 10), the 2 best checkpoints kept: decisions that do not hang
    on the last bits of a loss."""
    train, val = sets
    return (DeepLearningTask().model(_model()).optimizer(SGD(lr=0.2, momentum=0.9))
            .scheduler(ReduceLROnPlateau(monitor="train_loss", patience=0, factor=0.5, threshold=0.5))
            .data(train=train, val=val, batch_size=BATCH).epochs(epochs).seed(1).progress(False)
            .callback(EarlyStopping("val_loss", patience=2, min_delta=10.0, restore_best=True))
            .callback(ModelCheckpoint("val_loss", keep=2))
            .checkpoint(folder / "checkpoint.safetensors"))


@pytest.fixture(scope="module")
def straight(sets, tmp_path_factory):
    folder = tmp_path_factory.mktemp("straight")
    task = _task(sets, folder)
    task.fit()
    return task, folder


def test_the_run_stops_cuts_and_restores_as_configured(straight):
    task, folder = straight
    history = task.history
    assert [r.epoch for r in history] == [1, 2, 3]
    assert [r.lr for r in history] == [0.2, 0.2, 0.1]           # cut after epoch 2 (and 3), as the rule says
    assert task.stopped.startswith("early stopping: val_loss did not improve for 2 epochs")
    ranked = sorted(history, key=lambda r: (r.val_loss, r.epoch))[:2]
    expected = sorted(f"best-epoch{r.epoch:03d}.safetensors" for r in ranked)
    assert sorted(p.name for p in folder.glob("best-*")) == expected


def test_restore_best_puts_back_the_weights_of_the_best_epoch(sets, straight, tmp_path):
    task, _ = straight
    one = _task(sets, tmp_path, epochs=1)
    one.fit()
    for name, value in one.session().executor.state_dict().items():
        assert value.tobytes() == task.session().executor.state_dict()[name].tobytes(), name


def _interrupt_on_call(monkeypatch, dataset, call):
    """KeyboardInterrupt at the `call`-th batch (0-based) requested from a loader over `dataset`."""
    real, calls = DataLoader.batch, []

    def batch(self, e, i, order=None):
        if self.dataset is dataset:
            calls.append((e, i))
            if len(calls) == call + 1:
                raise KeyboardInterrupt
        return real(self, e, i, order)

    monkeypatch.setattr(DataLoader, "batch", batch)


INTERRUPTS = [("epoch 2 batch 1", "train", 5), ("validation of epoch 2", "val", 3), ("epoch 3 batch 3", "train", 11)]


@pytest.mark.parametrize("where, which, call", INTERRUPTS, ids=[i[0] for i in INTERRUPTS])
def test_interrupt_and_resume_stops_keeps_and_cuts_exactly_as_the_straight_run(sets, straight, tmp_path, monkeypatch,
                                                                               where, which, call):
    reference, reference_folder = straight
    with monkeypatch.context() as patch:
        _interrupt_on_call(patch, sets[0] if which == "train" else sets[1], call)
        with pytest.raises(KeyboardInterrupt):
            _task(sets, tmp_path).fit()
    resumed = _task(sets, tmp_path).resume(interrupt_path(tmp_path / "checkpoint.safetensors"))
    resumed.fit()
    a, b = reference.session(), resumed.session()
    assert [r.metrics() for r in a.history] == [r.metrics() for r in b.history]
    assert a.tracked.states == b.tracked.states and a.tracked.stopped == b.tracked.stopped
    for name, value in a.executor.state_dict().items():
        assert value.tobytes() == b.executor.state_dict()[name].tobytes(), f"weight {name}"
    for key, kept in a.tracked.kept.items():
        assert all(v.tobytes() == b.tracked.kept[key][n].tobytes() for n, v in kept.items()), key
    names = sorted(p.name for p in reference_folder.glob("best-*"))
    assert sorted(p.name for p in tmp_path.glob("best-*")) == names
    for name in names:
        theirs, ours = load_checkpoint(reference_folder / name)[0], load_checkpoint(tmp_path / name)[0]
        assert all(ours[k].tobytes() == v.tobytes() for k, v in theirs.items() if k.startswith("model.")), name


def test_a_stopped_run_resumes_as_stopped(sets, straight, tmp_path):
    _, folder = straight
    task = _task(sets, tmp_path).resume(folder / "checkpoint.safetensors")
    assert task.stopped.startswith("early stopping") and len(task.fit()) == 3


@pytest.mark.parametrize("stop", [StopTraining("enough"), StopIteration()], ids=["StopTraining", "StopIteration"])
def test_a_function_callback_stops_training_cleanly(sets, stop):
    train, val = sets

    def stop_after_two(record):
        if record.epoch == 2:
            raise stop

    task = (DeepLearningTask().model(_model()).data(train=train, val=val, batch_size=BATCH).epochs(4)
            .progress(False).callback(stop_after_two))
    assert [r.epoch for r in task.fit()] == [1, 2]
    assert task.stopped == ("enough" if isinstance(stop, StopTraining) else "stopped by callback 'stop_after_two'")


def test_a_watched_metric_the_run_lacks_is_refused_before_training(sets, tmp_path):
    train, _ = sets
    task = DeepLearningTask().model(_model()).data(train=train, batch_size=BATCH).progress(False)
    with pytest.raises(ConfigError, match="EarlyStopping watches val_loss but the task has no validation set"):
        task.callback(EarlyStopping()).fit()
    with pytest.raises(ConfigError, match="ReduceLROnPlateau watches val_loss"):
        task.scheduler(ReduceLROnPlateau()).fit()
    with pytest.raises(ConfigError, match="ModelCheckpoint has no folder"):
        task.callback(ModelCheckpoint("train_loss")).fit()
    with pytest.raises(ValueError, match="patience expects an int >= 1"):
        EarlyStopping(patience=0)
