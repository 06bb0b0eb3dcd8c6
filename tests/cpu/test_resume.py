"""Nothing lost: an interrupt anywhere resumes bit-identically on the CPU, a resume into another
configuration is refused naming the field (leaving the task as it was), and no setter drops
trained weights. Bit-identity is the contract here: one machine, one code path, the same
inputs; the runs compared are the same computation, split or not."""
import inspect
import os
import signal

import numpy as np
import pytest

from blueprint import BluePrint, cbr, dropout, fc, gap, seq
from blueprint.optim import SGD, AdamW, ConstantLR, CosineAnnealingLR, CrossEntropyLoss
from blueprint.task import ConfigError, DeepLearningTask
from blueprint.task import load_checkpoint
from blueprint.task import ResumeError, interrupt_path
from blueprint.task.data import ArrayDataset, Augment, DataLoader, digits
from cpu_ref import CpuExecutor

TRAIN_SIZE, VAL_SIZE, BATCH, EVAL_BATCH = 300, 100, 64, 64   # 5 train batches (the last has 44), 2 val batches
STEPS = -(-TRAIN_SIZE // BATCH)


@pytest.fixture(scope="module")
def sets():
    train, val = digits()
    return ArrayDataset(train.x[:TRAIN_SIZE], train.y[:TRAIN_SIZE]), ArrayDataset(val.x[:VAL_SIZE], val.y[:VAL_SIZE])


def make_task(sets):
    """Dropout, random crop + flip and a per-batch schedule: every random stream and the lr position matter."""
    train, val = sets
    model = BluePrint(seq(cbr(8, 3, 1, 1), gap(), dropout(0.25), fc(10)))
    return (DeepLearningTask().model(model).optimizer(SGD().lr(0.1).momentum(0.9).nesterov(True))
            .scheduler(CosineAnnealingLR().warmup(1).per_batch(True))
            .data(train=train, val=val, batch_size=BATCH, eval_batch_size=EVAL_BATCH,
                  augment=Augment(crop_padding=1, hflip=True))
            .epochs(2).seed(3).progress(False))


@pytest.fixture(scope="module")
def straight(sets):
    task = make_task(sets)
    task.fit()
    return task


def _assert_same_run(a, b):
    ea, eb = a.session().executor, b.session().executor
    for name, value in ea.state_dict().items():
        assert value.tobytes() == eb.state_dict()[name].tobytes(), f"weight {name} differs"
    for name, value in ea.optimizer_state().items():
        assert value.tobytes() == eb.optimizer_state()[name].tobytes(), f"optimizer state {name} differs"
    assert [r.metrics() for r in a.history] == [r.metrics() for r in b.history]


def _interrupt_at(monkeypatch, dataset, epoch, index):
    """Raise KeyboardInterrupt (once) when the loader over `dataset` is asked for batch `index` of `epoch`."""
    real = DataLoader.batch
    fired = []

    def batch(self, e, i, order=None):
        if self.dataset is dataset and (e, i) == (epoch, index) and not fired:
            fired.append(True)
            raise KeyboardInterrupt
        return real(self, e, i, order)

    monkeypatch.setattr(DataLoader, "batch", batch)
    return fired


# (where, which loader, epoch, batch index, position batch recorded)
INTERRUPTS = [
    ("epoch 1 batch 2", "train", 0, 2, 2),
    ("last batch of epoch 1", "train", 0, STEPS - 1, STEPS - 1),
    ("validation of epoch 1", "val", 0, 1, STEPS),
    ("epoch 2 batch 1", "train", 1, 1, 1),
    ("last batch of epoch 2", "train", 1, STEPS - 1, STEPS - 1),
    ("validation of epoch 2", "val", 0, 0, STEPS),
]


@pytest.mark.parametrize("where, loader, epoch, index, recorded", INTERRUPTS, ids=[i[0] for i in INTERRUPTS])
def test_interrupt_anywhere_then_resume_is_bit_identical(sets, straight, tmp_path, monkeypatch,
                                                         where, loader, epoch, index, recorded):
    checkpoint = tmp_path / "checkpoint.safetensors"
    dataset = sets[0] if loader == "train" else sets[1]
    interrupted = make_task(sets).checkpoint(checkpoint)
    if where.startswith("validation of epoch 2"):       # let epoch 1's validation pass first
        calls = []
        real = DataLoader.batch

        def batch(self, e, i, order=None):
            if self.dataset is dataset:
                calls.append(i)
                if len(calls) == 3:                      # epoch 1 used val batches 0 and 1
                    raise KeyboardInterrupt
            return real(self, e, i, order)
        monkeypatch.setattr(DataLoader, "batch", batch)
    else:
        _interrupt_at(monkeypatch, dataset, epoch, index)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    monkeypatch.undo()
    epochs_done = 1 if "epoch 2" in where else 0
    _, state = load_checkpoint(interrupt_path(checkpoint))
    assert state["epochs_done"] == epochs_done and state["position"]["batch"] == recorded
    assert state["position"]["epoch"] == epochs_done
    if epochs_done:   # the clean epoch-boundary checkpoint is a separate file, untouched by the interrupt
        _, boundary = load_checkpoint(checkpoint)
        assert boundary["epochs_done"] == 1 and boundary["position"] is None
    else:
        assert not checkpoint.exists()
    resumed = make_task(sets).checkpoint(checkpoint).resume(interrupt_path(checkpoint))
    resumed.fit()
    _assert_same_run(straight, resumed)
    assert not interrupt_path(checkpoint).exists(), "a finished epoch supersedes the interrupt checkpoint"


def test_ctrl_c_is_deferred_to_the_end_of_the_step(sets, straight, tmp_path, monkeypatch):
    """A real SIGINT during a step: the step completes, then the run stops with the position after it."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("the test runner handles SIGINT in this process, so fit() leaves it alone")
    checkpoint = tmp_path / "checkpoint.safetensors"
    real_step = CpuExecutor.submit_train_step   # what fit() calls

    def step(self, x, y, lr):
        if self.step_count == 2:
            os.kill(os.getpid(), signal.SIGINT)     # arrives while this step still has work to do
        return real_step(self, x, y, lr)

    monkeypatch.setattr(CpuExecutor, "submit_train_step", step)
    with pytest.raises(KeyboardInterrupt):
        make_task(sets).checkpoint(checkpoint).fit()
    monkeypatch.undo()
    _, state = load_checkpoint(interrupt_path(checkpoint))
    assert state["position"]["batch"] == 3 and int(load_checkpoint(interrupt_path(checkpoint))[0]["optim.step"]) == 3
    resumed = make_task(sets).resume(interrupt_path(checkpoint))
    resumed.fit()
    _assert_same_run(straight, resumed)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # the handler is restored


# ---- resume refuses another configuration ----------------------------------------------------------
@pytest.fixture(scope="module")
def one_epoch_checkpoint(sets, tmp_path_factory):
    path = tmp_path_factory.mktemp("resume") / "checkpoint.safetensors"
    make_task(sets).epochs(1).checkpoint(path).fit()
    return path


def _other_shape(sets):
    train, val = sets
    pad = ((0, 0), (0, 2), (0, 2), (0, 0))
    return ArrayDataset(np.pad(train.x, pad), train.y), ArrayDataset(np.pad(val.x, pad), val.y)


# (field, how this task differs, fragments of the message: field, the two values, the fix)
MISMATCHES = [
    ("model", lambda t, s: t.model(BluePrint(seq(cbr(4, 3, 1, 1), gap(), fc(10)))), ["different model", "cbr(4, 3"]),
    ("loss", lambda t, s: t.loss(CrossEntropyLoss().label_smoothing(0.1)),
     ["different loss", "CrossEntropyLoss().label_smoothing(0.1)", ".loss(CrossEntropyLoss())"]),
    ("optimizer kind", lambda t, s: t.optimizer(AdamW()), ["different optimizer kind", "SGD", "AdamW", "--optimizer sgd"]),
    ("scheduler", lambda t, s: t.scheduler(ConstantLR()), ["different scheduler", "ConstantLR()", ".scheduler("]),
    ("batch size", lambda t, s: t.data(train=s[0], val=s[1], batch_size=32, eval_batch_size=EVAL_BATCH),
     ["different batch size", "has 64, this task has 32", "--batch-size 64"]),
    ("input shape", lambda t, s: t.data(train=_other_shape(s)[0], val=_other_shape(s)[1], batch_size=BATCH),
     ["different input shape", "(8, 8, 1)", "(10, 10, 1)"]),
    ("seed", lambda t, s: t.seed(4), ["different seed", "--seed 3"]),
]


@pytest.mark.parametrize("field, differ, fragments", MISMATCHES, ids=[m[0] for m in MISMATCHES])
@pytest.mark.parametrize("trained_before", [False, True], ids=["fresh task", "trained task"])
def test_a_resume_into_another_configuration_is_refused_and_changes_nothing(
        sets, one_epoch_checkpoint, field, differ, fragments, trained_before):
    task = differ(make_task(sets).epochs(1), sets)
    if trained_before:
        task.fit()
        before = (task.session().executor.state_dict(), task.session().executor.optimizer_state(), task.history)
    with pytest.raises(ResumeError) as caught:
        task.resume(one_epoch_checkpoint)
    message = str(caught.value)
    assert "\n" not in message and str(one_epoch_checkpoint) in message and isinstance(caught.value, ValueError)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"
    if not trained_before:
        assert task._session == [], "a refused resume attached a session"
    else:
        weights, optimizer_state, history = before
        ex = task.session().executor
        assert all(v.tobytes() == weights[k].tobytes() for k, v in ex.state_dict().items())
        assert all(v.tobytes() == optimizer_state[k].tobytes() for k, v in ex.optimizer_state().items())
        assert task.history == history


def test_an_interrupt_inside_a_step_writes_no_interrupt_checkpoint(sets, tmp_path, monkeypatch):
    """A KeyboardInterrupt raised inside a step (a second Ctrl-C, or a foreign SIGINT handler): the weights
    may be half-updated, so no interrupt checkpoint is written; the epoch checkpoint stays."""
    checkpoint = tmp_path / "checkpoint.safetensors"
    real_step = CpuExecutor.submit_train_step   # what fit() calls

    def step(self, x, y, lr):
        if self.step_count == STEPS + 1:
            raise KeyboardInterrupt
        return real_step(self, x, y, lr)

    monkeypatch.setattr(CpuExecutor, "submit_train_step", step)
    with pytest.raises(KeyboardInterrupt):
        make_task(sets).checkpoint(checkpoint).fit()
    assert not interrupt_path(checkpoint).exists()
    assert load_checkpoint(checkpoint)[1]["epochs_done"] == 1


def test_a_late_refusal_loads_nothing(sets, one_epoch_checkpoint):
    """Same optimizer kind, but without momentum there is no momentum buffer: refused before any write."""
    task = make_task(sets).epochs(1).optimizer(SGD().lr(0.1))
    task.fit()
    weights = task.session().executor.state_dict()
    with pytest.raises(ValueError, match=r"load_optimizer_state: unexpected keys \['state0"):
        task.resume(one_epoch_checkpoint)
    assert all(v.tobytes() == weights[k].tobytes() for k, v in task.session().executor.state_dict().items())
    assert task.session().epochs_done == 1 and not task.session().resumed


# ---- setters never drop trained weights ---------------------------------------------------------------
NOT_SETTERS = {"validate", "resume", "load"}


def _setters():
    return sorted(name for name, fn in vars(DeepLearningTask).items()
                  if not name.startswith("_") and name not in NOT_SETTERS and callable(fn)
                  and "DeepLearningTask" in str(inspect.signature(fn).return_annotation))


# setter -> (arguments given the task and the data sets, "keeps" the session or "refuses")
SETTERS = {
    "model": (lambda t, s: (BluePrint(seq(cbr(4, 3, 1, 1), gap(), fc(10))),), "refuses"),
    "loss": (lambda t, s: (CrossEntropyLoss().label_smoothing(0.1),), "refuses"),
    "optimizer": (lambda t, s: (AdamW(),), "refuses"),
    "scheduler": (lambda t, s: (ConstantLR(),), "keeps"),
    "data": (lambda t, s: (), "keeps"),   # filled in below: the same shapes, a different sample
    "epochs": (lambda t, s: (5,), "keeps"),
    "device": (lambda t, s: ("cuda",), "refuses"),
    "amp": (lambda t, s: (True,), "refuses"),
    "fuse": (lambda t, s: (True,), "refuses"),
    "seed": (lambda t, s: (9,), "refuses"),
    "drop_last": (lambda t, s: (True,), "refuses"),   # 300 % 64 != 0: the partial-batch variant goes
    "progress": (lambda t, s: (True,), "keeps"),
    "callback": (lambda t, s: (print,), "keeps"),
    "log": (lambda t, s: (None,), "keeps"),
    "checkpoint": (lambda t, s: (None,), "keeps"),
    "distributed": (lambda t, s: (False,), "keeps"),   # one process stays one process (test_distributed: the rest)
}


def _same_shapes_other_sample(task, sets):
    train, val = sets
    return {"train": ArrayDataset(train.x[::-1].copy(), train.y[::-1].copy()), "val": val, "batch_size": BATCH,
            "eval_batch_size": EVAL_BATCH}


def test_the_setter_table_covers_every_setter():
    assert _setters() == sorted(SETTERS), "add the new setter to SETTERS (keeps or refuses)"


@pytest.fixture(scope="module")
def trained(sets):
    task = make_task(sets).epochs(1)
    task.fit()
    return task


@pytest.mark.parametrize("setter", sorted(SETTERS))
@pytest.mark.parametrize("how", ["trained", "resumed"])
def test_no_setter_drops_trained_weights(sets, trained, one_epoch_checkpoint, setter, how):
    task = trained if how == "trained" else make_task(sets).epochs(1).resume(one_epoch_checkpoint)
    weights = task.session().executor.state_dict()
    make_args, expected = SETTERS[setter]
    call = (lambda t: t.data(**_same_shapes_other_sample(t, sets))) if setter == "data" \
        else (lambda t: getattr(t, setter)(*make_args(t, sets)))
    if expected == "keeps":
        changed = call(task)
        assert changed is not task and changed.session() is task.session()
        assert changed.session().holds_training
        after = changed.session().executor.state_dict()
        assert all(after[k].tobytes() == weights[k].tobytes() for k in weights)
    else:
        with pytest.raises(ConfigError, match=r"holds trained weights .*task\.save\(path\) first"):
            call(task)
        same = getattr(task, setter)(*_current_value(task, setter)) if setter != "device" else task.device("cpu")
        assert same.session() is task.session(), "setting the current value must keep the session"


def _current_value(task, setter):
    return {"model": (task.blueprint_value,), "loss": (task.loss_config,), "optimizer": (task.optimizer_config,),
            "amp": (False,), "fuse": (False,), "seed": (task.seed_value,), "drop_last": (False,)}[setter]


def test_a_resumed_task_keeps_its_accuracy_through_setters(sets, trained, one_epoch_checkpoint):
    resumed = make_task(sets).epochs(1).resume(one_epoch_checkpoint)
    reference = resumed.evaluate(sets[1])["top1"]
    assert resumed.progress(False).epochs(3).scheduler(ConstantLR()).evaluate(sets[1])["top1"] == reference


def test_setters_on_an_untrained_task_still_rebuild_freely(sets):
    task = make_task(sets)
    task.session()                                   # compiled, never trained: nothing to lose
    assert task.seed(9).seed_value == 9 and task.model(BluePrint(seq(cbr(4, 3, 1, 1), gap(), fc(10)))) is not task
