"""load_state_dict / load_optimizer_state validate everything first, then write: a refused load
leaves the executor's weights, optimizer state and step count exactly as they were."""
import numpy as np
import pytest

from blueprint import BluePrint, bn, conv, fc, gap, relu, seq
from blueprint.optim import AdamW
from cpu_ref import CpuExecutor
from planner import ArchPlan
from planner.compiler import Compiler
from planner.executor_api import OPTIMIZER_FIX, WEIGHTS_FIX, StateError

NET = BluePrint(seq(conv(4, 3, 1, 1), bn(), relu(), conv(6, 3, 1, 1), bn(), relu(), gap(), fc(3)))
SHAPE, BATCH = (6, 6, 2), 4


@pytest.fixture()
def trained():
    """An AdamW executor two steps in (two state slots per parameter, step 2)."""
    h, w, c = SHAPE
    plan = Compiler(ArchPlan.from_blueprint(NET, in_channels=c)).compile(
        {"train": (BATCH, h, w, c), "eval": (BATCH, h, w, c)}, optimizer_state_slots=2)
    ex = CpuExecutor(plan, optimizer=AdamW(), seed=0)
    rng = np.random.default_rng(0)
    for _ in range(2):
        ex.train_step(rng.standard_normal((BATCH,) + SHAPE).astype(np.float32), rng.integers(0, 3, BATCH), 0.01)
    return ex


def _snapshot(ex):
    return ex.state_dict(), ex.optimizer_state(), ex.step_count


def _assert_unchanged(ex, before):
    weights, optim, step = before
    assert ex.step_count == step
    for name, value in ex.state_dict().items():
        assert value.tobytes() == weights[name].tobytes(), f"{name} was written by a refused load"
    for name, value in ex.optimizer_state().items():
        assert value.tobytes() == optim[name].tobytes(), f"{name} was written by a refused load"


def _last_buffer(state):
    return sorted(k for k in state if k != "step")[-1]


def _edit(state, name, value):
    return {**state, name: value}


def _without(state, name):
    return {k: v for k, v in state.items() if k != name}


# (what, how to break a good optimizer state, fragment of the one-line message)
BROKEN_OPTIMIZER_STATES = [
    ("mis-shaped last buffer", lambda s: _edit(s, _last_buffer(s), np.zeros(s[_last_buffer(s)].size + 1, np.float32)),
     "mis-shaped keys"),
    ("scalar for a buffer (no broadcasting)", lambda s: _edit(s, _last_buffer(s), np.float32(0.5)), "got ()"),
    ("missing buffer", lambda s: _without(s, _last_buffer(s)), "missing keys"),
    ("missing step", lambda s: _without(s, "step"), "missing keys ['step']"),
    ("negative step", lambda s: _edit(s, "step", np.array(-1, np.int64)), "'step' must be one integer >= 0"),
    ("fractional step", lambda s: _edit(s, "step", np.array(2.5)), "'step' must be one integer >= 0"),
    ("NaN in a buffer", lambda s: _edit(s, _last_buffer(s), np.full_like(s[_last_buffer(s)], np.nan)), "NaN/Inf"),
    ("integer buffer", lambda s: _edit(s, _last_buffer(s), s[_last_buffer(s)].astype(np.int64)),
     "expected a floating array"),
    ("unexpected key", lambda s: _edit(s, "state9.fc.weight", np.zeros(3, np.float32)), "unexpected keys"),
    ("negative loss scale", lambda s: _edit(s, "amp.loss_scale", np.array([-1.0], np.float32)),
     "'amp.loss_scale' must be one finite number >= 0"),
]


@pytest.mark.parametrize("what, break_state, fragment", BROKEN_OPTIMIZER_STATES, ids=[b[0] for b in BROKEN_OPTIMIZER_STATES])
def test_a_refused_optimizer_state_writes_nothing(trained, what, break_state, fragment):
    good = trained.optimizer_state()
    other = {k: (v * 2 if k != "step" else np.array(7, np.int64)) for k, v in good.items()}   # would change everything
    before = _snapshot(trained)
    with pytest.raises(StateError) as caught:
        trained.load_optimizer_state(break_state(other))
    message = str(caught.value)
    assert fragment in message and "nothing was loaded" in message and "\n" not in message
    assert message.endswith(f"(nothing was loaded; {OPTIMIZER_FIX})")
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, KeyError)
    _assert_unchanged(trained, before)
    trained.load_optimizer_state(other)               # the unbroken state loads
    assert trained.step_count == 7
    assert all(np.array_equal(trained.optimizer_state()[k], other[k]) for k in other)


BROKEN_WEIGHTS = [
    ("NaN weight", lambda s: _edit(s, "0.weight", np.full_like(s["0.weight"], np.nan)), "0.weight: holds"),
    ("string array", lambda s: _edit(s, "7.bias", np.array(["a", "b", "c"])), "expected a real numeric array"),
    ("mis-shaped last key", lambda s: _edit(s, sorted(s)[-1], np.zeros(99, np.float32)), "mis-shaped keys"),
]


@pytest.mark.parametrize("what, break_state, fragment", BROKEN_WEIGHTS, ids=[b[0] for b in BROKEN_WEIGHTS])
def test_refused_weights_write_nothing(trained, what, break_state, fragment):
    other = {k: v + 1 for k, v in trained.state_dict().items()}
    before = _snapshot(trained)
    with pytest.raises(StateError, match="load_state_dict: .*" + fragment.replace("(", r"\(")) as caught:
        trained.load_state_dict(break_state(other))
    assert str(caught.value).endswith(f"(nothing was loaded; {WEIGHTS_FIX})")
    _assert_unchanged(trained, before)
