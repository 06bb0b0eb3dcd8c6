"""Every kind of the op table runs on the CUDA path, and a missing registration fails when the executor
is built (fused kinds are checked primitive by primitive), naming the kind, the path and the file."""

import numpy as np
import pytest
from numba import cuda

from blueprint import BluePrint, block, BlockStyle, cbr, gap_fc, seq
from cuda_kernels import CudaExecutor, elementwise
from cuda_kernels._table import CUDA
from cuda_kernels.tape import Immediate
from planner import ArchPlan
from planner.compiler import Compiler
from planner.kernel_table import MissingKernelError
from planner.ops import ACTIVATIONS, Prim

from tests.support.every_kind import every_kind_plan  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),   # simulator only
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]


@pytest.mark.parametrize("prim", list(Prim), ids=str)
def test_every_kind_is_implemented_on_the_cuda_path(prim):
    assert CUDA.required(prim)
    for direction in CUDA.required(prim):
        assert callable(CUDA.lookup(prim, direction)), f"{prim} {direction}"


def test_every_activation_has_its_two_kernels():
    assert set(elementwise.ACTIVATION_KERNELS) == set(ACTIVATIONS)
    for prim, kernels in elementwise.ACTIVATION_KERNELS.items():
        assert (kernels.forward.name, kernels.backward.name) == (f"activation_forward.{prim.value}",
                                                                 f"activation_backward.{prim.value}")


def test_the_executor_runs_a_plan_with_every_kind():
    plan = every_kind_plan(amp=True)
    ex = CudaExecutor(plan, seed=1, init_loss_scale=2.0 ** 8)
    x = np.random.default_rng(0).standard_normal(plan.variants["train"].input_shape).astype(np.float32)
    loss = ex.train_step(x, np.array([0, 3]), lr=0.01)
    assert np.isfinite(loss)


def _fused_plan():
    bp = BluePrint(seq(cbr(8, 3, 1, 1), block(8, BlockStyle.RESNET_3_3), gap_fc(5)))
    arch = ArchPlan.from_blueprint(bp, in_channels=3, fuse=True, amp=True)
    return Compiler(arch).compile({"train": (2, 4, 4, 3), "eval": (2, 4, 4, 3)})


@pytest.mark.parametrize("plan, prim, direction, home", [
    (every_kind_plan, Prim.HARDSWISH, "forward", "cuda_kernels/elementwise.py"),
    (every_kind_plan, Prim.MAXPOOL, "backward", "cuda_kernels/_ops.py"),
    (_fused_plan, Prim.ADD, "backward", "cuda_kernels/_ops.py"),     # inside a fused BasicBlock
], ids=["activation", "maxpool", "fused-add"])
def test_a_missing_registration_fails_when_the_executor_is_built(monkeypatch, plan, prim, direction, home):
    compiled = plan(amp=True) if plan is every_kind_plan else plan()
    monkeypatch.delitem(CUDA._impls, (prim, direction))
    with pytest.raises(MissingKernelError, match=rf"the cuda path has no {direction} implementation of "
                                                 rf"'{prim.value}' .* in {home}"):
        CudaExecutor(compiled)


@pytest.mark.parametrize("kind", [Prim.CONV, "gelu2", 7])
def test_an_activation_launch_refuses_what_is_not_a_registered_activation(kind):
    x = cuda.device_array(4, np.float16)
    with pytest.raises(ValueError, match="activation kernel: expected one of .*'relu'.*, got"):
        elementwise.activation_forward(Immediate(), kind, x, x)
    with pytest.raises(ValueError, match="activation kernel: expected one of"):
        elementwise.activation_backward(Immediate(), kind, x, x, x)
