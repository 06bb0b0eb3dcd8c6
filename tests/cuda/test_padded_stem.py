"""The stem on the aligned tensor-core path (issue 23, item 3), in the simulator.

A 3-channel input is uploaded into the plan's 8-channel input slot (the padded channels zero), and the
stem's convolution (3x3, and 7x7 stride 2 as ResNet-50's) runs the aligned kernels with an fp16 weight
copy padded to 8 channels (zero columns); the weight gradient's padded columns are left out, so the
master weight, its gradient and the optimizer state keep 3 channels. Checked against the fp32 CPU path
from the same weights and batch: the loss, the eval logits and every gradient (the stem's dW among them);
then with nonzero values written into the input's padded channels, where neither the forward (the padded
weight columns are zero) nor the gradient (the padded columns are never added) may change.
Tolerances as ``test_executor`` (fp16 activations; a BN over 32 values).
"""
import numpy as np
import pytest

from blueprint import BluePrint, cbr, gap_fc, named, seq
from blueprint.optim import SGD, CrossEntropyLoss
from cpu_ref import CpuExecutor
from cuda_kernels import CudaExecutor
from tests.cuda.test_executor import CHECK_SCALE, GRAD_TOL, assert_close, compile_plan

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]
BATCH, CLASSES, LR = 2, 8, 0.05
# (kernel, stride, padding, input HWC): ResNet-18/20-CIFAR's stem and ResNet-50's (on a small image)
STEMS = {"3x3": (3, 1, 1, (4, 4, 3)), "7x7s2": (7, 2, 3, (8, 8, 3))}


def _net(kernel, stride, padding):
    return BluePrint(seq(named("conv1", cbr(8, kernel, stride, padding)), named("fc", gap_fc(CLASSES))), "stem_net")


def _batch(hwc, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BATCH,) + hwc).astype(np.float32), rng.integers(0, CLASSES, BATCH)


@pytest.fixture(scope="module", params=sorted(STEMS))
def stem(request):
    kernel, stride, padding, hwc = STEMS[request.param]
    bp = _net(kernel, stride, padding)
    optimizer, loss = SGD().momentum(0.9).weight_decay(1e-3), CrossEntropyLoss()
    cpu = CpuExecutor(compile_plan(bp, fuse=False, amp=False, hwc=hwc, batch=BATCH, eval_batch=BATCH), loss,
                      optimizer, seed=4)
    plan = compile_plan(bp, fuse=True, amp=True, hwc=hwc, batch=BATCH, eval_batch=BATCH)
    cuda = CudaExecutor(plan, loss, optimizer, seed=4, init_loss_scale=CHECK_SCALE)
    return request.param, hwc, plan, cpu, cuda


def _step(executor, start, x, y):
    """From the weights ``start``: the eval logits of ``x``, then one training step's loss and gradients."""
    executor.load_state_dict(start)
    logits = executor.forward(x)
    loss = executor.train_step(x, y, LR)
    return loss, executor.gradients(), logits


def test_the_stem_runs_the_aligned_kernels_and_matches_the_cpu_path(stem):
    name, hwc, plan, cpu, cuda = stem
    weight = next(p for p in plan.params if p.name == "conv1.0.weight")
    assert weight.shape[-1] == 3 and weight.half_padded >= 0 and plan.tensor(weight.half_padded).shape[-1] == 8
    start = cpu.state_dict()
    x, y = _batch(hwc, 1)
    loss, grads, logits = _step(cuda, start, x, y)
    launched = set(cuda._runners[("train", "train")].tape.names())
    gemms = sorted(n for n in launched if n.startswith("mma_conv2d"))
    assert any(n.startswith("mma_conv2d_forward_bn_stats_") for n in gemms), gemms
    assert any(n.startswith("mma_conv2d_backward_weight_") for n in gemms), gemms
    assert not any("any_channels" in n for n in gemms), gemms
    want_loss, want_grads, want_logits = _step(cpu, start, x, y)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-2)
    assert grads["conv1.0.weight"].shape == want_grads["conv1.0.weight"].shape == (8, 3) + STEMS[name][:1] * 2
    assert_close(grads, want_grads, GRAD_TOL, f"{name} gradient")
    assert_close({"logits": logits}, {"logits": want_logits}, GRAD_TOL, f"{name} eval logits")
    # the user-visible weight and optimizer state keep 3 channels; the padded copy's extra columns stay 0
    assert cuda.state_dict()["conv1.0.weight"].shape == (8, 3) + STEMS[name][:1] * 2
    assert all(v.size in (0, 1) or v.shape[-3:] != (STEMS[name][0],) * 2 + (8,)
               for v in cuda.optimizer_state().values())
    # the upload leaves the input slot's padded channels zero (an inf there would reach the output: inf x 0)
    for staging in cuda._staging.values():
        assert all(np.all(host[..., 3:] == 0) and host.shape[-1] == 8 for host in staging.inputs["input"].host)
    padded = cuda._download(cuda._persistent[weight.half_padded])
    master = cuda._download(cuda._persistent[weight.tensor])
    assert np.all(padded[..., 3:] == 0) and np.array_equal(padded[..., :3], master.astype(np.float16))


def test_values_in_the_inputs_padded_channels_reach_neither_the_output_nor_the_gradient(stem):
    """Nonzero padded channels: the forward reads them only through the zero weight columns, and the weight
    gradient's padded columns (then nonzero) are never added into the 3-channel gradient."""
    name, hwc, plan, cpu, cuda = stem
    start = cpu.state_dict()
    x, y = _batch(hwc, 2)
    _step(cuda, start, x, y)   # records the step (and its staging buffers)
    for staging in cuda._staging.values():
        for host in staging.inputs["input"].host:
            host[..., 3:] = 3.0
    loss, grads, logits = _step(cuda, start, x, y)
    want_loss, want_grads, want_logits = _step(cpu, start, x, y)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-2)
    assert_close(grads, want_grads, GRAD_TOL, f"{name} gradient, padded channels nonzero")
    assert_close({"logits": logits}, {"logits": want_logits}, GRAD_TOL, f"{name} eval logits, padded channels nonzero")
