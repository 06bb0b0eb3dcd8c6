"""Whole networks against hand-written PyTorch models (benchmarks/torch_models.py, written
independently of our planner): same weights, same batches -> logits, loss, every parameter
gradient, and parameters + BN running statistics after 3 optimizer steps.

PyTorch runs in float64 and we run in float32, so the tolerances below are float32 rounding
accumulated over a few layers and steps (documented per check)."""
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: parity tests need it (pip install torch==2.13.0)")
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import torch_models  # noqa: E402

from blueprint import BluePrint, bn, conv, dropout, fc, gap, mbconv, named, relu6, seq, zoo  # noqa: E402
from blueprint.optim import SGD, AdamW, CrossEntropyLoss  # noqa: E402
from cpu_ref import CpuExecutor  # noqa: E402
from planner import ArchPlan  # noqa: E402
from planner.compiler import Compiler  # noqa: E402

LOGIT_TOL = 2e-4      # relative to the logits' scale
GRAD_TOL = 5e-4       # relative to each gradient's largest entry ...
GRAD_FLOOR = 1e-4     # ... or to this, for gradients that are exactly 0 in exact arithmetic (a BN bias
                      # followed by a linear layer and another BN)
PARAM_TOL = 2e-5      # absolute, parameters after 3 steps (their scale is ~1), for 99% of the entries
PARAM_TOL_MAX = 3e-4  # absolute, every entry: Adam divides by sqrt(v), so an entry whose gradient is
                      # ~1e-7 turns float32 rounding into a visible fraction of a step
STAT_TOL = 2e-5       # absolute, BN running statistics


def tiny_mobilenet_blueprint():
    return BluePrint(seq(named("features", seq(seq(conv(8, 3, 1, 1), bn(), relu6()), mbconv(1, 8, 1), mbconv(6, 16, 2),
                                               mbconv(6, 16, 1), seq(conv(32, 1, 1, 0), bn(), relu6()))),
                         gap(), named("classifier", seq(dropout(0.0), fc(10)))))


NETWORKS = [
    # name, our blueprint, torch model factory, input (H, W, C), batch
    ("mlp", lambda: zoo.mlp([48, 32, 16, 10]), lambda: torch_models.mlp([48, 32, 16, 10]), (4, 4, 3), 6),
    ("resnet20", lambda: zoo.resnet20(), lambda: torch_models.resnet20(), (16, 16, 3), 16),
    ("tiny_mobilenet", tiny_mobilenet_blueprint, lambda: torch_models.tiny_mobilenet(), (8, 8, 3), 4),
]
OPTIMIZERS = [
    ("sgd", SGD().lr(0.05).momentum(0.9).nesterov(True).weight_decay(1e-3),
     lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    # eps=1e-4: some gradients are exactly 0 in exact arithmetic (a BN bias before a linear layer and
    # another BN, as in MobileNetV2) and ~1e-8 float32 noise here; with eps=1e-8 Adam would turn that
    # noise into full lr-sized steps on both sides, differently.
    ("adamw", AdamW().lr(1e-3).betas(0.9, 0.99).eps(1e-4).weight_decay(0.05),
     lambda params: torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.99), eps=1e-4, weight_decay=0.05)),
]


def _run_torch(net, x):
    if isinstance(net, torch.nn.Sequential):  # the MLP: torch flattens NCHW in (C, H, W) order
        return net(torch.tensor(x.transpose(0, 3, 1, 2).astype(np.float64)).reshape(x.shape[0], -1))
    return net(torch.tensor(x.transpose(0, 3, 1, 2).astype(np.float64)))


def _rel(a, b, floor=1e-12):
    return np.abs(a - b).max() / max(np.abs(b).max(), floor)


@pytest.mark.parametrize("opt_name, ours_opt, torch_opt", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
@pytest.mark.parametrize("name, make_bp, make_torch, hwc, batch", NETWORKS, ids=[n[0] for n in NETWORKS])
def test_three_steps_match_pytorch(name, make_bp, make_torch, hwc, batch, opt_name, ours_opt, torch_opt):
    h, w, c = hwc
    arch = ArchPlan.from_blueprint(make_bp(), in_channels=c)
    plan = Compiler(arch).compile({"train": (batch, h, w, c), "eval": (batch, h, w, c)},
                                  optimizer_state_slots=ours_opt.state_slots)
    plan.verify()
    loss_cfg = CrossEntropyLoss().label_smoothing(0.1)
    ours = CpuExecutor(plan, loss_cfg, ours_opt, seed=3)
    net = make_torch().double().train()
    state = ours.state_dict()
    assert set(state) == set(net.state_dict()), "parameter names differ from the torch model's"
    net.load_state_dict({k: torch.tensor(v) if v.dtype == np.int64 else torch.tensor(v.astype(np.float64))
                         for k, v in state.items()})
    optimizer = torch_opt(net.parameters())
    rng = np.random.default_rng(11)
    for step in range(3):
        x = rng.standard_normal((batch, h, w, c)).astype(np.float32)
        y = rng.integers(0, 10, batch)
        logits = ours.forward(x, train=False) if step == 0 else None
        if step == 0:
            net.eval()
            expected = _run_torch(net, x).detach().numpy()
            assert _rel(logits, expected) < LOGIT_TOL, f"eval logits differ ({_rel(logits, expected):.2e})"
            net.train()
        loss = ours.train_step(x, y, ours_opt.learning_rate)
        optimizer.zero_grad()
        torch_loss = F.cross_entropy(_run_torch(net, x), torch.tensor(y), label_smoothing=0.1)
        torch_loss.backward()
        assert abs(loss - torch_loss.item()) < 1e-5 * max(1.0, abs(torch_loss.item())), (step, loss, torch_loss.item())
        grads = ours.gradients()
        for pname, param in net.named_parameters():
            assert _rel(grads[pname], param.grad.numpy(), GRAD_FLOOR) < GRAD_TOL, f"step {step}: gradient of {pname} differs"
        optimizer.step()
    final, expected = ours.state_dict(), net.state_dict()
    for key, value in final.items():
        want = expected[key].numpy()
        if key.endswith("num_batches_tracked"):
            assert value == want == 3
        elif "running" in key:
            assert np.abs(value - want).max() < STAT_TOL, f"{key} differs after 3 steps"
        else:
            error = np.abs(value - want)
            assert np.quantile(error, 0.99) < PARAM_TOL and error.max() < PARAM_TOL_MAX, f"{key} differs after 3 steps"
