"""MobileNetV3-Large/Small and EfficientNet-B0 against torchvision's own models, on its weights.

torchvision builds each model (its initialisers, seeded), a calibration pass gives its BatchNorms
running statistics of the size real data gives (at mean 0 / var 1 the eval signal of these deep
networks vanishes and the comparison would check nothing), and its state_dict is loaded strictly
into ours. Then, at one small input, three sides are compared as in test_torch_parity.py: ours
(float32), torchvision in float64 (the reference) and torchvision in float32: eval logits, and one
training step's loss and every parameter gradient from identical parameters (dropout and stochastic
depth at p = 0, so the step is deterministic). Our distance to the reference may be at most
``FP32_MULTIPLE`` times torchvision-float32's distance, plus ``FLOOR`` times the quantity's scale.
A batch is drawn until no activation input of the float64 reference lies within that margin of a
kink (ReLU 0, Hardswish / Hardsigmoid +-3), where a float32 side could take the other branch.
"""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: parity tests need it (pip install torch==2.13.0)")
import torch.nn.functional as F  # noqa: E402

from blueprint import zoo  # noqa: E402
from blueprint.optim import SGD, CrossEntropyLoss  # noqa: E402
from cpu_ref import CpuExecutor  # noqa: E402
from planner import ArchPlan  # noqa: E402
from planner.compiler import Compiler  # noqa: E402
from tests.support.float32_error import FP32_MULTIPLE, assert_like_float32  # noqa: E402
from tests.support.torchvision_ref import torchvision_or_skip  # noqa: E402

BATCH, HWC, CLASSES = 2, (32, 32, 3), 10
CALIBRATION_BATCH = 32
MAX_DRAWS = 40

# name -> (our builder with dropout / stochastic depth off, torchvision builder kwargs)
MODELS = {
    "mobilenet_v3_large": (lambda: zoo.mobilenet_v3_large(CLASSES, dropout=0.0), dict(dropout=0.0)),
    "mobilenet_v3_small": (lambda: zoo.mobilenet_v3_small(CLASSES, dropout=0.0), dict(dropout=0.0)),
    "efficientnet_b0": (lambda: zoo.efficientnet_b0(CLASSES, dropout=0.0, stochastic_depth_prob=0.0),
                        dict(dropout=0.0, stochastic_depth_prob=0.0)),
}


def _torchvision_model(name, kwargs):
    tv = torchvision_or_skip()
    torch.manual_seed(0)
    model = getattr(tv.models, name)(num_classes=CLASSES, **kwargs)
    with torch.no_grad():   # BN statistics of real size: one cumulative-average pass over a random batch
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.reset_running_stats()
                m.momentum, m.saved_momentum = None, m.momentum
        model.train()(torch.randn(CALIBRATION_BATCH, HWC[2], HWC[0], HWC[1]))
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.momentum = m.saved_momentum
        last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.weight.mul_(30.0)   # its N(0, 0.01) init makes the logits tiny; no activation follows it
    return model.train()


def _run(net, x):
    return net(torch.tensor(x.transpose(0, 3, 1, 2)).to(next(net.parameters()).dtype))


def _eval_logits(net, x):
    net.eval()
    with torch.no_grad():
        logits = _run(net, x).double().numpy()
    net.train()
    return logits


KINKS = {torch.nn.ReLU: (0.0,), torch.nn.ReLU6: (0.0, 6.0), torch.nn.Hardswish: (-3.0, 3.0),
         torch.nn.Hardsigmoid: (-3.0, 3.0)}


def _activation_inputs(net, x, train):
    net = copy.deepcopy(net).train() if train else net.eval()   # a train-mode forward moves the BN statistics
    seen = []
    hooks = [m.register_forward_pre_hook(lambda module, args: seen.append((KINKS[type(module)],
                                                                           args[0].detach().double().numpy().copy())))
             for m in net.modules() if type(m) in KINKS]
    with torch.no_grad():
        _run(net, x)
    for hook in hooks:
        hook.remove()
    net.train()
    return seen


def _clear_of_kinks(reference, torch32, x, train):
    """No activation input of the reference's forward (train or eval mode) within ``FP32_MULTIPLE`` times
    its float32 error of a kink. The error is taken per element, but at least the tensor's mean error:
    test_torch_parity.py's margin from the tensor's largest error leaves almost no clear batch here
    (MobileNetV3-Large has ~170k activation inputs at 2x32x32, measured: 2-10 of them within that margin
    per batch; 0-2 with this one)."""
    for (kinks, a), (_, b) in zip(_activation_inputs(reference, x, train), _activation_inputs(torch32, x, train)):
        error = np.abs(a - b)
        margin = FP32_MULTIPLE * np.maximum(error, error.mean())
        for k in kinks:
            if ((np.abs(a - k) <= margin) & ~((a == k) & (b == k))).any():
                return False
    return True


def _clear_batch(reference, torch32, rng, train, label):
    """A batch (drawn from ``rng``) clear of kinks in that mode; which one depends on float64 values only."""
    for draws in range(1, MAX_DRAWS + 1):
        x = rng.standard_normal((BATCH,) + HWC).astype(np.float32)
        if _clear_of_kinks(reference, torch32, x, train):
            print(f"{label}: a batch clear of kinks at draw {draws}")
            return x
    pytest.fail(f"{label}: each of {MAX_DRAWS} batches puts an activation input within float32's error of a kink")


def _torch_step(net, x, y):
    net.zero_grad()
    loss = F.cross_entropy(_run(net, x), torch.tensor(y))
    loss.backward()
    return loss.item(), {name: p.grad.detach().double().numpy().copy() for name, p in net.named_parameters()}


@pytest.mark.parametrize("name", MODELS)
def test_eval_logits_and_one_training_step_match_torchvision(name):
    make_ours, tv_kwargs = MODELS[name]
    reference = _torchvision_model(name, tv_kwargs).double()
    with torch.no_grad():   # every side starts from the float32-rounded weights
        for value in reference.state_dict().values():
            if value.is_floating_point():
                value.copy_(value.float().double())
    torch32 = copy.deepcopy(reference).float()
    arch = ArchPlan.from_blueprint(make_ours(), in_channels=HWC[2])
    plan = Compiler(arch).compile({"train": (BATCH,) + HWC, "eval": (BATCH,) + HWC})
    plan.verify()
    ours = CpuExecutor(plan, CrossEntropyLoss(), SGD().lr(0.0), seed=0)
    ours.load_state_dict({k: v.float() for k, v in reference.state_dict().items()}, strict=True)
    rng = np.random.default_rng(5)
    x = _clear_batch(reference, torch32, rng, False, f"{name} eval")
    reference_logits = _eval_logits(reference, x)
    assert np.ptp(reference_logits, axis=0).max() > 1e-2 * np.abs(reference_logits).max(), \
        "the eval logits must depend on the input"
    assert_like_float32("eval logits", ours.forward(x, train=False), _eval_logits(torch32, x), reference_logits,
                        oracle="torchvision")

    x = _clear_batch(reference, torch32, rng, True, f"{name} train")
    y = rng.integers(0, CLASSES, BATCH)
    loss = ours.train_step(x, y, 0.0)
    grads = ours.gradients()
    loss32, grads32 = _torch_step(torch32, x, y)
    loss64, grads64 = _torch_step(reference, x, y)
    assert_like_float32("loss", loss, loss32, loss64, oracle="torchvision")
    assert set(grads) == set(grads64)
    largest = max(np.abs(g).max() for g in grads64.values())
    for pname, want in grads64.items():
        assert_like_float32(f"gradient of {pname}", grads[pname], grads32[pname], want, scale=largest, oracle="torchvision")
