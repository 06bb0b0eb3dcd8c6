"""The gradient hook on the CUDA path: `_after_backward` is called once, while the training step is
recorded, with the launch tape; what it records there runs in every replay between the backward
kernels and the optimizer, so the update applies the gradients it leaves."""
import numpy as np
import pytest

from blueprint import BluePrint, cbr, gap_fc, seq
from blueprint.optim import SGD
from cuda_kernels import CudaExecutor
from cuda_kernels.elementwise import fill_zero
from planner import ArchPlan
from planner.compiler import Compiler

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),   # simulator only
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

SHAPE = (2, 4, 4, 3)
NET = BluePrint(seq(cbr(8, 3, 1, 1), gap_fc(3)))
SCALE = 2.0 ** 8   # small enough that this tiny step's scaled gradients fit in fp16 (no skipped step)


class HookedExecutor(CudaExecutor):
    zero_gradients = False

    def _after_backward(self, views, tape=None):
        self.hook_calls = getattr(self, "hook_calls", []) + [tape is not None]
        if self.zero_gradients:
            fill_zero(tape, self._regions["grads"].view(np.uint32))


def _executor(zero_gradients):
    plan = Compiler(ArchPlan.from_blueprint(NET, fuse=True, amp=True)).compile({"train": SHAPE, "eval": SHAPE})
    executor = HookedExecutor(plan, optimizer=SGD().lr(0.1), seed=0, init_loss_scale=SCALE)
    executor.zero_gradients = zero_gradients
    return executor


@pytest.mark.parametrize("zero_gradients", [False, True])
def test_the_hook_is_recorded_once_and_acts_before_the_update(zero_gradients):
    executor = _executor(zero_gradients)
    rng = np.random.default_rng(0)
    trainable = [p.name for p in executor.plan.params if p.region == "params"]
    before = executor.state_dict()
    for _ in range(2):
        executor.train_step(rng.standard_normal(SHAPE).astype(np.float32), rng.integers(0, 3, SHAPE[0]), 0.1)
    assert executor.hook_calls == [True]                    # recorded once, with the tape; replayed twice
    assert not executor.skipped_last_step
    after = executor.state_dict()
    unchanged = [np.array_equal(after[name], before[name]) for name in trainable]
    assert all(unchanged) if zero_gradients else not any(unchanged)
