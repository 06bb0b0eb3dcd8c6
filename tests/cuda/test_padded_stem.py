"""The stem on the aligned tensor-core path (issue 23, item 3), in the simulator.

A 3-channel batch is uploaded with its 3 channels (slot ``input_unpadded``), and the step's first kernel writes
it into the plan's 8-channel input slot, zeros in the padded channels (``channel_pad_forward_vec8``, inside the
recorded step); the stem's convolution (3x3, and 7x7 stride 2 as ResNet-50's) runs the aligned kernels with
an fp16 weight copy padded to 8 channels (zero columns); the weight gradient's padded columns are left out,
so the master weight, its gradient and the optimizer state keep 3 channels. Checked against the fp32 CPU
path from the same weights and batch: the loss, the eval logits and every gradient (the stem's dW among
them); then with an inf written into the input slot's padded channels before each step: the pad kernel
must overwrite it with zeros (an inf left there reaches the output through the zero weight columns: inf x 0).
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
    # the host uploads 3 channels; the step pads them on the device: the slot holds the batch and zeros
    for staging in cuda._staging.values():
        assert all(host.shape == (BATCH,) + hwc for host in staging.inputs["input"].host)
    _check_input_slot(cuda, plan, x)
    padded = cuda._download(cuda._persistent[weight.half_padded])
    master = cuda._download(cuda._persistent[weight.tensor])
    assert np.all(padded[..., 3:] == 0) and np.array_equal(padded[..., :3], master.astype(np.float16))


def _check_input_slot(cuda, plan, x):
    """The padded input slot after a step: ``x`` in fp16 in its first 3 channels, zeros in the other 5."""
    slot = cuda._download(cuda._persistent[plan.io["input"]]).reshape(x.shape[:3] + (8,))
    assert np.array_equal(slot[..., :3], x.astype(np.float16)), "the input slot's real channels are not the batch"
    assert np.all(slot[..., 3:] == 0), f"the input slot's padded channels are not zero: {np.unique(slot[..., 3:])}"


def _poison_padded_channels(cuda, plan):
    """An inf in every padded channel of the input slot (what a stale or never-written pad would leave)."""
    view = cuda._persistent[plan.io["input"]]
    host = cuda._download(view)
    host.reshape(-1, 8)[:, 3:] = np.inf
    cuda._upload(view, host)


def test_the_step_pads_the_input_on_the_device_over_whatever_the_slot_held(stem):
    """An inf in the input slot's padded channels before each step (forward, eval, train) would reach the output
    (inf x the zero weight columns = nan): the step's pad kernel rewrites them with zeros, and the results match
    the CPU path's; afterwards the slot holds the batch and zeros."""
    name, hwc, plan, cpu, cuda = stem
    start = cpu.state_dict()
    x, y = _batch(hwc, 2)
    cuda.load_state_dict(start)
    _poison_padded_channels(cuda, plan)
    logits = cuda.forward(x)
    _poison_padded_channels(cuda, plan)
    eval_loss, _, eval_logits = cuda.evaluate_batch(x, y)
    _poison_padded_channels(cuda, plan)
    loss = cuda.train_step(x, y, LR)
    grads = cuda.gradients()
    _check_input_slot(cuda, plan, x)
    want_loss, want_grads, want_logits = _step(cpu, start, x, y)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-2)
    assert_close(grads, want_grads, GRAD_TOL, f"{name} gradient, padded channels poisoned")
    for what, got in (("forward", logits), ("eval", eval_logits)):
        assert_close({"logits": got}, {"logits": want_logits}, GRAD_TOL, f"{name} {what} logits, poisoned")
    assert np.isfinite(eval_loss)


def test_the_pad_is_the_first_kernel_of_every_recorded_step(stem):
    """Inside the recorded step (graph capture takes it with the kernels; replay repeats it): the upload of the
    3-channel slot before it, then the pad, before any other kernel, in the train, eval and forward steps."""
    name, hwc, plan, cpu, cuda = stem
    x, y = _batch(hwc, 3)
    cuda.forward(x), cuda.evaluate_batch(x, y), cuda.train_step(x, y, LR)   # records the three steps
    assert {purpose for _, purpose in cuda._runners} == {"train", "eval", "forward"}, sorted(cuda._runners)
    unpadded = cuda._persistent[plan.io["input_unpadded"]]
    for key, runner in cuda._runners.items():
        before, body, _ = runner.tape.segments()
        assert [e.name for e in before if e.kind == "upload"][0] == "input"
        kernels = [e for e in body if e.kind == "kernel" and not e.name.startswith("fill_zero")]
        pad = kernels[0]
        assert pad.name == "channel_pad_forward_vec8" and [e.name for e in kernels].count(pad.name) == 1, key
        assert cuda._staging[key].inputs["input"].view.nbytes == BATCH * int(np.prod(hwc)) * 2
        assert pad.args[0].nbytes == unpadded.nbytes and pad.args[1].nbytes == BATCH * int(np.prod(hwc[:2])) * 8 * 2
