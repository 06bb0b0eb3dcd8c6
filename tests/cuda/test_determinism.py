"""Every kernel launch of the simulator tier's training steps, run twice from the same inputs, the
second time under forced thread switches (``tests/support/determinism.py``): the same bytes, or, where
the launch adds floats atomically, the same values up to the order of addition.

Why: a pipelined step once ended with other weights than the same step run alone, only on a loaded
machine. The cause was the simulator's shared-array allocation (two threads of a block could get
two different "shared" arrays; corrected in ``cuda_kernels/_simulator.py``), but a kernel that reads
before a barrier would fail the same way, on a GPU too; this check makes such a result move in
every CI run instead of once in a while. Without the correction, these tests fail within a step
(checked by hand: duplicated twin scratch arrays, then a wrong mma result).
"""
import numpy as np
import pytest

from blueprint.optim import SGD
from cuda_kernels import CudaExecutor
from tests.cuda.test_executor import CHECK_SCALE, SMALL, batches, compile_plan
from tests.support.determinism import run_twice

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

def test_every_launch_of_the_pipelined_tests_step_gives_the_same_result_under_contention():
    """The step that once moved (test_executor's SMALL: the stem's tensor-core forward on its zero-padded input and its
    gradients, max pooling, dropout, the fused GapFc, the loss, SGD and the loss-scale kernels). Every kernel
    of the kernel tables is also checked at its first launch in test_kernels.py and test_mma_conv.py
    (``tests/support/cuda_checks.replay``); the larger fused networks cost minutes here and add no kernel."""
    ex = CudaExecutor(compile_plan(SMALL, fuse=True, amp=True), optimizer=SGD().momentum(0.9), seed=5,
                      init_loss_scale=CHECK_SCALE)
    (x, y), (x2, y2) = batches(2, seed=7)
    ex.train_step(x, y, 0.1)            # records and compiles the step; the momentum buffers are now live
    staging, tape = ex._staging[("train", "train")], ex._runners[("train", "train")].tape
    turn = staging.begin({"input": x2, "labels": y2, "lr": 0.1})
    checked = run_twice(list(tape), ex.stream)
    assert checked == tape.names() and len(checked) > 10
    assert np.isfinite(staging.result(turn)["loss"][0])
