"""``CudaExecutor(kernels="mma" | "simt")``: the tensor-core GEMMs in a fused network's training step.

One step of a small fused ResNet (CBR, a downsampling BasicBlock with projection, GapFc with
8 classes so its fc runs on tensor cores too) from the same weights and batch on both kernel
families. They differ only in fp32 summation order and in which fp16 roundings of equal
values happen, so the loss agrees to 1e-3 relative and every gradient to 1e-2 of its norm
(``test_executor.assert_close``'s measure; fp16 activations through a dozen layers). The
network-level cross-check against the CPU path runs with the default ("mma") in test_executor.py.
"""
import numpy as np
import pytest

from blueprint import BlockStyle, BluePrint, block, cbr, gap_fc, seq
from cuda_kernels import CudaExecutor
from planner import ArchPlan
from planner.compiler import Compiler

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
NET = BluePrint(seq(cbr(8, 3, 1, 1), block(16, BlockStyle.RESNET_3_3_DS), gap_fc(8)), "mma_net")
BATCH, HWC, SCALE = 4, (4, 4, 3), 2.0 ** 12


def _one_step(kernels):
    arch = ArchPlan.from_blueprint(NET, in_channels=HWC[2], fuse=True, amp=True)
    plan = Compiler(arch).compile({"train": (BATCH,) + HWC, "eval": (BATCH,) + HWC})
    ex = CudaExecutor(plan, seed=5, init_loss_scale=SCALE, kernels=kernels)
    rng = np.random.default_rng(21)
    x, y = rng.standard_normal((BATCH,) + HWC).astype(np.float32), rng.integers(0, 8, BATCH)
    loss = ex.train_step(x, y, 0.05)
    names = set(ex._runners[("train", "train")].tape.names())
    return loss, ex.gradients(), names


def test_one_training_step_agrees_between_mma_and_simt_kernels():
    (loss_mma, grads_mma, names_mma), (loss_simt, grads_simt, names_simt) = _one_step("mma"), _one_step("simt")
    assert {n for n in names_mma if n.startswith("mma_")} >= {
        "mma_conv2d_forward_bn_stats_32x16x32", "mma_conv2d_backward_weight_32x16x32",
        "mma_conv2d_backward_data_32x16x32", "mma_linear_forward_bias_32x16x32"}, names_mma
    assert not any(n.startswith("mma_") for n in names_simt)
    np.testing.assert_allclose(loss_mma, loss_simt, rtol=1e-3)
    floor = 1e-2 * max(np.linalg.norm(g) for g in grads_simt.values())
    for name, want in grads_simt.items():
        error = float(np.linalg.norm(np.asarray(grads_mma[name], np.float64) - want))
        assert error <= 1e-2 * max(float(np.linalg.norm(want)), floor), f"{name}: |difference| {error:.3g}"


def test_an_unknown_kernel_family_is_refused():
    arch = ArchPlan.from_blueprint(NET, in_channels=HWC[2], fuse=True, amp=True)
    plan = Compiler(arch).compile({"train": (BATCH,) + HWC, "eval": (BATCH,) + HWC})
    with pytest.raises(ValueError, match="expected one of \\['mma', 'simt'\\], got 'wmma'"):
        CudaExecutor(plan, kernels="wmma")
