"""Squeeze-excitation, hardswish / SiLU mbconv blocks and stochastic depth on the CUDA path, against
the fp32 CPU reference, one training step from identical weights (as test_executor.py, whose
tolerances and comparison this file reuses).

With ``fuse=True`` the blocks no fused kind expresses (SE, other activations, drop_path) stay unfused
primitives and the se's pool + projection is not merged into a GapFc (only the head's is); both plans
must train like the CPU path. (tests/null/test_se_plan.py checks that a MobileNetV2-form block next to
them still fuses.) The net has no ReLU / ReLU6: with them (an SE with its default ReLU, a ReLU6
block), some of their inputs lay within fp16 rounding of the kink at every batch tried (seeds 4-11),
and the flipped elements put 3-13% into earlier gradients on the fp16 path, fused or not alike; the
smooth version differs from the CPU path by 0.2-0.7% (measured in the simulator).
"""
import numpy as np
import pytest

from blueprint import BluePrint, bn, conv, gap_fc, mbconv, se, seq, silu
from blueprint.optim import SGD, CrossEntropyLoss
from cpu_ref import CpuExecutor
from planner import reference as R
from cuda_kernels import CudaExecutor
from planner.executor_api import dropout_seed
from tests.cuda.test_executor import CHECK_SCALE, GRAD_TOL, assert_close, batches, compile_plan

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),   # simulator only
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

SEED = 3
TINY_SE_NET = BluePrint(seq(conv(8, 3, 1, 1), bn(), silu(),
                            mbconv(2, 8, 1, 3, "hardswish", se(8, "hardsigmoid", "silu"), 0.5),
                            mbconv(1, 16, 1, 3, "silu", se(0.25, "sigmoid", "silu")),
                            gap_fc(5)), "tiny_se_net")


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_se_blocks_and_drop_path_train_like_the_cpu_reference(fuse):
    plan = compile_plan(TINY_SE_NET, fuse=fuse, amp=True)
    kinds = [layer.kind for layer in plan.arch.layers]
    assert {"channel_mul", "drop_path", "hardsigmoid", "hardswish", "silu"} <= set(kinds)
    if fuse:   # only the head fuses
        assert kinds.count("gap_fc") == 1 and kinds.count("gap") == 2 and "inv_residual" not in kinds
    position = next(i for i, p in enumerate(plan.primitives) if p.kind == "drop_path")
    mask = R.drop_path_mask(4, 0.5, dropout_seed(SEED, position), 0)
    assert 0 < mask.sum() < 4, "the step must keep some samples and drop others"
    loss = CrossEntropyLoss()
    optimizer = SGD().momentum(0.9)
    cpu = CpuExecutor(compile_plan(TINY_SE_NET, fuse=False, amp=False), loss, optimizer, seed=SEED)
    ex = CudaExecutor(plan, loss, optimizer, seed=SEED, init_loss_scale=CHECK_SCALE)   # the same drop_path draw
    ex.load_state_dict(cpu.state_dict())
    (x, y), = batches(1, seed=4)
    assert_close({"logits": ex.forward(x)}, {"logits": cpu.forward(x)}, GRAD_TOL, "eval")
    np.testing.assert_allclose(ex.train_step(x, y, 0.05), cpu.train_step(x, y, 0.05), rtol=1e-2)
    assert not ex.skipped_last_step
    got, want = ex.gradients(), cpu.gradients()
    assert any(k.endswith("fc1.weight") for k in want) and all(np.abs(want[k]).max() > 0 for k in want)
    assert_close(got, want, GRAD_TOL, f"fuse={fuse} gradient")
