"""The gradient hook of the shared step skeleton (`ExecutorBase._after_backward`): called once per
training step, after the last backward op and before the optimizer op, and what it does to the
gradient region is what the optimizer applies (a data-parallel all-reduce needs exactly that)."""
import numpy as np
import pytest

from blueprint import BluePrint, bn, conv, fc, gap, relu, seq
from blueprint.optim import SGD
from cpu_ref import CpuExecutor
from planner import ArchPlan
from planner.compiler import Compiler

SHAPE = (4, 6, 6, 3)
NET = BluePrint(seq(conv(4, 3, 1, 1), bn(), relu(), gap(), fc(5)))


class TracingExecutor(CpuExecutor):
    """Records the direction of every op it runs and where the hook was called; `zero_gradients`
    makes the hook clear the whole gradient region."""

    zero_gradients = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trace = []

    def _run(self, op, views, variant):
        self.trace.append(op.direction)
        return super()._run(op, views, variant)

    def _after_backward(self, views, tape=None):
        self.trace.append(("hook", tape, views is self._variant_views(self._variant_for(SHAPE, "train"))))
        if self.zero_gradients:
            self._regions["grads"][...] = 0


def _executor(cls=TracingExecutor):
    plan = Compiler(ArchPlan.from_blueprint(NET)).compile({"train": SHAPE, "eval": SHAPE})
    return cls(plan, optimizer=SGD().lr(0.1), seed=0)


def _batch():
    rng = np.random.default_rng(0)
    return rng.standard_normal(SHAPE).astype(np.float32), rng.integers(0, 5, SHAPE[0])


def test_the_hook_runs_once_between_the_last_backward_op_and_the_optimizer():
    executor = _executor()
    x, y = _batch()
    executor.train_step(x, y, 0.1)
    hooks = [i for i, entry in enumerate(executor.trace) if isinstance(entry, tuple)]
    assert len(hooks) == 1
    at = hooks[0]
    assert executor.trace[at] == ("hook", None, True)            # the CPU path: no tape, the step's views
    assert executor.trace[at - 1] == "backward" and executor.trace[at + 1:] == ["optimizer"]
    assert "backward" not in executor.trace[at + 1:]


@pytest.mark.parametrize("call", ["forward", "forward_train", "evaluate_batch"])
def test_steps_without_an_update_do_not_call_the_hook(call):
    executor = _executor()
    x, y = _batch()
    {"forward": lambda: executor.forward(x), "forward_train": lambda: executor.forward(x, train=True),
     "evaluate_batch": lambda: executor.evaluate_batch(x, y)}[call]()
    assert executor.trace and not any(isinstance(entry, tuple) for entry in executor.trace)


def test_what_the_hook_does_to_the_gradients_is_what_the_optimizer_applies():
    x, y = _batch()
    plain, hooked = _executor(), _executor()
    hooked.zero_gradients = True
    before = hooked.state_dict()
    plain.train_step(x, y, 0.1)
    hooked.train_step(x, y, 0.1)
    trainable = [p.name for p in hooked.plan.params if p.region == "params"]
    assert all(np.array_equal(hooked.state_dict()[name], before[name]) for name in trainable)
    assert not all(np.array_equal(plain.state_dict()[name], before[name]) for name in trainable)
    assert all(not g.any() for g in hooked.gradients().values())
