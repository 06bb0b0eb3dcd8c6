"""Whole networks against PyTorch models (tests/support/torch_models.py: torchvision's, written
independently of our planner), one step at a time at identical parameters.

Three sides take every step: ours (float32), PyTorch in float64 (the reference) and PyTorch in
float32. Before each step the reference's parameters and BN statistics are rounded to float32
and loaded into all three, so every side computes that step from the same values; each side
keeps its own optimizer state, so the optimizer (momentum, Adam's moments and step count) is
still tested across steps. Nothing runs free: a BatchNorm over few values turns float32
rounding into visible differences within a step or two, differently on every BLAS kernel and
thread count, so comparing where two free trajectories end fails on the next machine.

Tolerances come from float32's own error on that very step: for every compared quantity
(eval logits, loss, each gradient, each parameter and BN statistic after the update) our
distance to the float64 reference may be at most ``FP32_MULTIPLE`` times PyTorch-float32's
distance to it, plus ``FLOOR`` times the quantity's scale (``tests/support/float32_error.py`` says why
those numbers).

A step is only comparable where the network is smooth: an activation input within float32's
error of a ReLU/ReLU6 kink takes the other branch on one float32 side, and the BatchNorm
backward before it spreads that one element over its channel (measured: 1e-2 relative errors in
every earlier gradient of resnet20, on PyTorch-float32 as on ours). So each step's batch is
drawn until the float64 reference has no activation input that close to a kink
(``_clear_of_kinks``); the choice depends on float64 values only, so it is the same on every
machine. The networks are small enough (resnet20 on 8x8 images, batch 4) that a clear batch
is found within a few dozen draws.
"""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: parity tests need it (pip install torch==2.13.0)")
import torch.nn.functional as F  # noqa: E402

from tests.support import torch_models  # noqa: E402

from blueprint import BluePrint, bn, conv, dropout, fc, gap, mbconv, named, relu6, seq, zoo  # noqa: E402
from blueprint.optim import SGD, AdamW, CrossEntropyLoss  # noqa: E402
from cpu_ref import CpuExecutor  # noqa: E402
from planner import ArchPlan  # noqa: E402
from planner.compiler import Compiler  # noqa: E402
from tests.support.float32_error import FP32_MULTIPLE, assert_like_float32  # noqa: E402

STEPS = 3


def tiny_mobilenet_blueprint():
    return BluePrint(seq(named("features", seq(seq(conv(8, 3, 1, 1), bn(), relu6()), mbconv(1, 8, 1), mbconv(6, 16, 2),
                                               mbconv(6, 16, 1), seq(conv(32, 1, 1, 0), bn(), relu6()))),
                         gap(), named("classifier", seq(dropout(0.0), fc(10)))))


NETWORKS = [
    # name, our blueprint, torch model factory, input (H, W, C), batch
    ("mlp", lambda: zoo.mlp([48, 32, 16, 10]), lambda: torch_models.mlp([48, 32, 16, 10]), (4, 4, 3), 6),
    ("resnet20", lambda: zoo.resnet20(), lambda: torch_models.resnet20(), (8, 8, 3), 4),
    ("tiny_mobilenet", tiny_mobilenet_blueprint, lambda: torch_models.tiny_mobilenet(), (8, 8, 3), 4),
]
OPTIMIZERS = [
    ("sgd", SGD().lr(0.05).momentum(0.9).nesterov(True).weight_decay(1e-3),
     lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    # eps=1e-4: some gradients are exactly 0 in exact arithmetic (a BN bias before a linear layer and
    # another BN, as in MobileNetV2) and ~1e-8 float32 noise here; with eps=1e-8 Adam would turn that
    # noise into full lr-sized steps on every side, differently.
    ("adamw", AdamW().lr(1e-3).betas(0.9, 0.99).eps(1e-4).weight_decay(0.05),
     lambda params: torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.05)),
]


def _run_torch(net, x):
    dtype = next(net.parameters()).dtype
    x = torch.tensor(x.transpose(0, 3, 1, 2)).to(dtype)
    if isinstance(net, torch.nn.Sequential):  # the MLP: torch flattens NCHW in (C, H, W) order
        x = x.reshape(x.shape[0], -1)
    return net(x)


def _torch_step(net, optimizer, x, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(_run_torch(net, x), torch.tensor(y), label_smoothing=0.1)
    loss.backward()
    grads = {name: p.grad.detach().double().numpy().copy() for name, p in net.named_parameters()}
    optimizer.step()
    return loss.item(), grads


#: The kinks of the activations the networks use: an input within float32's error of one takes
#: the other branch on one side, and a BatchNorm backward spreads that one element over a
#: whole channel (1e-2 relative errors in every earlier gradient, on PyTorch-float32 as on ours).
KINKS = {torch.nn.ReLU: (0.0,), torch.nn.ReLU6: (0.0, 6.0)}
#: Batches drawn at most for one step before the test gives up (measured: at most 50 over the
#: 3 steps of one case, 1 to ~20 per step).
MAX_DRAWS = 100


def _activation_inputs(net, x, train):
    """``(kinks, input)`` of every ReLU/ReLU6 call of one forward, in call order (float64)."""
    net = copy.deepcopy(net).train(train)  # a train-mode forward moves the BN statistics: use a copy
    seen = []
    hooks = [m.register_forward_pre_hook(lambda module, args: seen.append((KINKS[type(module)],
                                                                           args[0].detach().double().numpy().copy())))
             for m in net.modules() if type(m) in KINKS]
    with torch.no_grad():
        _run_torch(net, x)
    for hook in hooks:
        hook.remove()
    return seen


def _clear_of_kinks(reference, torch32, x):
    """Whether every activation input of the float64 reference, in the train and the eval forward,
    is more than ``FP32_MULTIPLE`` times float32's own forward error away from a kink: only then
    does every float32 implementation within the tolerance take the branches the reference takes."""
    for train in (True, False):
        want, got = _activation_inputs(reference, x, train), _activation_inputs(torch32, x, train)
        for (kinks, a), (_, b) in zip(want, got):
            margin = FP32_MULTIPLE * np.abs(a - b).max()
            for k in kinks:  # an input exactly at the kink on both sides (zero padding, say) is no risk
                if ((np.abs(a - k) <= margin) & ~((a == k) & (b == k))).any():
                    return False
    return True


def _eval_logits(net, x):
    net.eval()
    with torch.no_grad():
        logits = _run_torch(net, x).double().numpy()
    net.train()
    return logits


@pytest.mark.parametrize("opt_name, ours_opt, torch_opt", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
@pytest.mark.parametrize("name, make_bp, make_torch, hwc, batch", NETWORKS, ids=[n[0] for n in NETWORKS])
def test_each_step_matches_pytorch_at_identical_parameters(name, make_bp, make_torch, hwc, batch, opt_name, ours_opt,
                                                           torch_opt):
    h, w, c = hwc
    arch = ArchPlan.from_blueprint(make_bp(), in_channels=c)
    plan = Compiler(arch).compile({"train": (batch, h, w, c), "eval": (batch, h, w, c)},
                                  optimizer_state_slots=ours_opt.state_slots)
    plan.verify()
    ours = CpuExecutor(plan, CrossEntropyLoss().label_smoothing(0.1), ours_opt, seed=3)
    reference = make_torch().double().train()
    assert set(ours.state_dict()) == set(reference.state_dict()), "parameter names differ from the torch model's"
    reference.load_state_dict({k: torch.tensor(v) for k, v in ours.state_dict().items()})
    torch32 = copy.deepcopy(reference).float()
    optimizers = {"reference": torch_opt(reference.parameters()), "torch32": torch_opt(torch32.parameters())}
    rng = np.random.default_rng(11)
    for step in range(STEPS):
        # the reference's state, rounded to float32, is where all three sides start this step
        with torch.no_grad():
            for value in reference.state_dict().values():
                if value.is_floating_point():
                    value.copy_(value.float().double())
        start = {k: v.numpy().copy() for k, v in reference.state_dict().items()}
        ours.load_state_dict({k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in start.items()})
        torch32.load_state_dict({k: torch.tensor(v) for k, v in start.items()})

        for _ in range(MAX_DRAWS):
            x = rng.standard_normal((batch, h, w, c)).astype(np.float32)
            y = rng.integers(0, 10, batch)
            if _clear_of_kinks(reference, torch32, x):
                break
        else:
            pytest.fail(f"step {step}: each of {MAX_DRAWS} batches puts an activation input within float32's error "
                        f"of a kink; use a smaller network or batch")
        assert_like_float32(f"step {step}: eval logits", ours.forward(x, train=False), _eval_logits(torch32, x),
                            _eval_logits(reference, x))

        loss = ours.train_step(x, y, ours_opt.learning_rate)
        grads = ours.gradients()
        loss32, grads32 = _torch_step(torch32, optimizers["torch32"], x, y)
        loss64, grads64 = _torch_step(reference, optimizers["reference"], x, y)
        assert_like_float32(f"step {step}: loss", loss, loss32, loss64)
        largest_gradient = max(np.abs(g).max() for g in grads64.values())
        for pname in grads64:
            assert_like_float32(f"step {step}: gradient of {pname}", grads[pname], grads32[pname], grads64[pname],
                                scale=largest_gradient)

        after, after32, after64 = ours.state_dict(), torch32.state_dict(), reference.state_dict()
        for key, want in after64.items():
            if key.endswith("num_batches_tracked"):
                assert after[key] == after32[key].item() == want.item() == start[key] + 1, key
            else:  # parameters after the optimizer's update, BN running statistics after the step
                assert_like_float32(f"step {step}: {key} after the update", after[key], after32[key].numpy(),
                                    want.numpy())
        assert ours.step_count == step + 1
