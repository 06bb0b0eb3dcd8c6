"""PyTorch as the oracle of the primitives' semantics.

The numpy reference (float64) is compared with ``torch.nn.functional`` (float64, NCHW
via permutes) on forward outputs and input/parameter gradients; test_kernels.py ties the
numba kernels to the reference. Stateful semantics (BatchNorm running statistics,
cross-entropy with label smoothing, SGD / Adam / AdamW over several steps) are checked
on the fp32 kernels against torch directly.
"""
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest

from cpu_ref import kernels as K
from planner import ops
from planner import reference as R
from tests.support.kind_params import TORCH_NAMES, examples, in_attrs_order

torch = pytest.importorskip("torch", reason="PyTorch not installed: parity tests need it (pip install torch==2.13.0)")
F = torch.nn.functional

F32 = np.float32


def nchw(t):
    return t.permute(0, 3, 1, 2)


def nhwc(t):
    return t.permute(0, 2, 3, 1)


@dataclass(frozen=True)
class Parity:
    """``ours(t) -> y`` and ``ours_grad(t, dy) -> {name: grad}`` on numpy float64 (NHWC);
    ``theirs(t) -> y`` on torch float64 tensors (NHWC in, NHWC out); ``grads`` names the
    inputs whose gradients are compared."""
    id: str
    shapes: dict
    ours: Callable
    ours_grad: Callable
    theirs: Callable
    grads: tuple
    makers: dict = field(default_factory=dict)


def conv(n, h, w, cin, cout, k, s, p, g):
    def ours_grad(t, dy):
        dx, dw = R.conv2d_backward(t["x"], t["w"], dy, s, p, g)
        return {"x": dx, "w": dw}

    return Parity(f"conv{k}x{k}_s{s}p{p}g{g}_{cin}to{cout}", {"x": (n, h, w, cin), "w": (cout, k, k, cin // g)},
                  lambda t: R.conv2d_forward(t["x"], t["w"], s, p, g), ours_grad,
                  lambda t: nhwc(F.conv2d(nchw(t["x"]), nchw(t["w"]), stride=s, padding=p, groups=g)), ("x", "w"))


def batchnorm_train_4d(n, h, w, c, eps=1e-5):
    def ours(t):
        return R.batchnorm_forward_train(t["x"].reshape(-1, c), t["gamma"], t["beta"], np.zeros(c), np.ones(c), 0.1,
                                         eps)[0].reshape(t["x"].shape)

    def ours_grad(t, dy):
        x2d = t["x"].reshape(-1, c)
        _, mean, invstd, _, _ = R.batchnorm_forward_train(x2d, t["gamma"], t["beta"], np.zeros(c), np.ones(c), 0.1, eps)
        dx, dgamma, dbeta = R.batchnorm_backward(x2d, t["gamma"], mean, invstd, dy.reshape(-1, c))
        return {"x": dx.reshape(t["x"].shape), "gamma": dgamma, "beta": dbeta}

    def theirs(t):
        return nhwc(F.batch_norm(nchw(t["x"]), None, None, t["gamma"], t["beta"], training=True, eps=eps))

    return Parity(f"bn_train_{n}x{h}x{w}x{c}", {"x": (n, h, w, c), "gamma": (c,), "beta": (c,)}, ours, ours_grad,
                  theirs, ("x", "gamma", "beta"))


def batchnorm_eval(m, c, eps=1e-5):
    def theirs(t):
        return F.batch_norm(t["x"], t["rm"], t["rv"], t["gamma"], t["beta"], training=False, eps=eps)

    return Parity(f"bn_eval_{m}x{c}", {"x": (m, c), "gamma": (c,), "beta": (c,), "rm": (c,), "rv": (c,)},
                  lambda t: R.batchnorm_forward_eval(t["x"], t["gamma"], t["beta"], t["rm"], t["rv"], eps), None,
                  theirs, (), {"rv": lambda rng, shape: rng.uniform(0.5, 2.0, shape)})


# activations whose float64 twin is not ``F.<kind>`` itself: F.hardsigmoid's float64 backward multiplies by
# the float32 constant 1/6 (relative error 3e-8, above this comparison's 1e-10), so its definition is used;
# the fp32 kernel is checked against F.hardsigmoid itself in test_se_ops_torch.py
# F.celu's float64 kernel divides by alpha through 1/alpha rounded to float32 (relative error 1.3e-7 at
# alpha 1.7), so its definition is used; F.celu itself is the oracle of tests/cpu/test_parameterised_kinds.py
TORCH_TWINS = {ops.Prim.HARDSIGMOID: lambda x: F.relu6(x + 3) / 6,
               ops.Prim.CELU: lambda x, alpha: torch.where(x > 0, x, alpha * torch.expm1(x / alpha))}


def torch_activation(kind, params: dict):
    """PyTorch's twin of an op-table activation: ``torch.nn.functional.<kind>``, with the row's parameters as
    keyword arguments of the same names (elu's ``alpha``; leaky_relu's ``slope`` is PyTorch's
    ``negative_slope``). A new activation whose name differs from PyTorch's needs a mapping here
    (``TORCH_TWINS``)."""
    fn = TORCH_TWINS.get(kind) or getattr(F, kind.value)
    rename = {} if kind in TORCH_TWINS else TORCH_NAMES
    keywords = {rename.get(name, name): value for name, value in params.items()}
    return lambda x: fn(x, **keywords)


def activation(kind, n=60):
    row, values = ops.OPS[kind], examples(kind)   # every parameter at a non-default value
    params = in_attrs_order(kind, values)

    def ours_grad(t, dy):
        y = row.reference_forward(t["x"], *params)
        return {"x": row.reference_backward(y if row.saves == ("output",) else t["x"], dy, *params)}

    theirs = torch_activation(kind, values)
    return Parity(kind.value, {"x": (n,)}, lambda t: row.reference_forward(t["x"], *params), ours_grad,
                  lambda t: theirs(t["x"]), ("x",), {"x": lambda rng, shape: 4 * rng.standard_normal(shape)})


def maxpool(n, h, w, c, k, s, p):
    def ours_grad(t, dy):
        return {"x": R.maxpool_backward(R.maxpool_forward(t["x"], k, s, p)[1], dy, t["x"].shape)}

    return Parity(f"maxpool{k}s{s}p{p}", {"x": (n, h, w, c)}, lambda t: R.maxpool_forward(t["x"], k, s, p)[0],
                  ours_grad, lambda t: nhwc(F.max_pool2d(nchw(t["x"]), k, s, p)), ("x",))


def avgpool(n, h, w, c, k, s, p):
    return Parity(f"avgpool{k}s{s}p{p}", {"x": (n, h, w, c)}, lambda t: R.avgpool_forward(t["x"], k, s, p),
                  lambda t, dy: {"x": R.avgpool_backward(dy, t["x"].shape, k, s, p)},
                  lambda t: nhwc(F.avg_pool2d(nchw(t["x"]), k, s, p, count_include_pad=True)), ("x",))


def gap(n, h, w, c):
    return Parity("gap", {"x": (n, h, w, c)}, lambda t: R.gap_forward(t["x"]),
                  lambda t, dy: {"x": R.gap_backward(dy, t["x"].shape)},
                  lambda t: F.adaptive_avg_pool2d(nchw(t["x"]), 1).flatten(1), ("x",))


def linear(n, fin, fout, bias):
    shapes = {"x": (n, fin), "w": (fout, fin)} | ({"b": (fout,)} if bias else {})

    def ours_grad(t, dy):
        dx, dw, db = R.linear_backward(t["x"], t["w"], dy)
        return {"x": dx, "w": dw, "b": db}

    return Parity(f"linear_bias{bias}", shapes, lambda t: R.linear_forward(t["x"], t["w"], t.get("b")), ours_grad,
                  lambda t: F.linear(t["x"], t["w"], t.get("b")), tuple(shapes))


def channel_pad(n, h, w, c, c_out):
    return Parity("channel_pad", {"x": (n, h, w, c)}, lambda t: R.channel_pad_forward(t["x"], c_out),
                  lambda t, dy: {"x": R.channel_pad_backward(dy, c)},
                  lambda t: F.pad(t["x"], (0, c_out - c)), ("x",))


def channel_mul(n, h, w, c):
    def ours_grad(t, dy):
        dx, ds = R.channel_mul_backward(t["x"], t["s"], dy)
        return {"x": dx, "s": ds}

    return Parity("channel_mul", {"x": (n, h, w, c), "s": (n, c)}, lambda t: R.channel_mul_forward(t["x"], t["s"]),
                  ours_grad, lambda t: nhwc(nchw(t["x"]) * t["s"][:, :, None, None]), ("x", "s"))


def cross_entropy(n, k, smoothing):
    def labels(rng, shape):
        return rng.integers(0, k, shape)

    return Parity(f"cross_entropy_ls{smoothing}", {"logits": (n, k), "labels": (n,)},
                  lambda t: np.array(R.softmax_cross_entropy(t["logits"], t["labels"], smoothing)[0]),
                  lambda t, dy: {"logits": dy * R.softmax_cross_entropy(t["logits"], t["labels"], smoothing)[1]},
                  lambda t: F.cross_entropy(t["logits"], t["labels"], label_smoothing=smoothing), ("logits",),
                  {"labels": labels})


PARITY = [
    conv(2, 6, 5, 3, 4, 3, 1, 1, 1),
    conv(2, 7, 7, 4, 6, 3, 2, 1, 2),
    conv(2, 7, 6, 3, 5, 5, 2, 2, 1),
    conv(2, 6, 6, 4, 6, 1, 2, 0, 1),
    conv(2, 5, 5, 6, 4, 1, 1, 0, 1),
    conv(2, 7, 7, 6, 6, 3, 2, 1, 6),   # depthwise, strided
    conv(2, 6, 6, 4, 4, 3, 1, 1, 4),   # depthwise
    batchnorm_train_4d(2, 3, 4, 5),
    batchnorm_eval(7, 4),
    *[activation(kind) for kind in ops.ACTIVATIONS],   # every activation of the op table
    maxpool(2, 7, 6, 3, 3, 2, 1),
    maxpool(2, 6, 6, 2, 2, 2, 0),
    avgpool(2, 7, 6, 3, 3, 2, 1),
    avgpool(2, 5, 5, 2, 3, 1, 1),
    gap(3, 4, 5, 6),
    linear(5, 7, 4, True),
    linear(3, 6, 5, False),
    channel_pad(2, 3, 3, 3, 5),
    channel_mul(2, 3, 4, 5),
    cross_entropy(6, 5, 0.0),
    cross_entropy(5, 7, 0.2),
]


@pytest.mark.parametrize("case", PARITY, ids=lambda c: c.id)
def test_reference_matches_torch(case):
    rng = np.random.default_rng(0)
    t = {name: case.makers.get(name, lambda r, s: r.standard_normal(s))(rng, shape) for name, shape in case.shapes.items()}
    tt = {name: torch.tensor(v, requires_grad=name in case.grads) for name, v in t.items()}
    y_theirs = case.theirs(tt)
    y_ours = case.ours(t)
    np.testing.assert_allclose(y_ours, y_theirs.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=f"{case.id} forward")
    if not case.grads:
        return
    dy = np.asarray(rng.standard_normal(np.shape(y_ours)))
    y_theirs.backward(torch.tensor(dy))
    ours = case.ours_grad(t, dy)
    for name in case.grads:
        np.testing.assert_allclose(ours[name], tt[name].grad.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=f"{case.id} d{name}")


# ---------------------------------------------------------------------------- fp32 kernels vs torch

@pytest.mark.parametrize("momentum", [0.1, 0.5])
def test_batchnorm_kernel_running_statistics_match_torch(momentum):
    rng = np.random.default_rng(1)
    n, h, w, c = 3, 4, 4, 5
    bn = torch.nn.BatchNorm2d(c, momentum=momentum, eps=1e-5)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor(rng.standard_normal(c)))
        bn.bias.copy_(torch.tensor(rng.standard_normal(c)))
    gamma, beta = bn.weight.detach().numpy().copy(), bn.bias.detach().numpy().copy()
    rm, rv = np.zeros(c, F32), np.ones(c, F32)
    mean, invstd = np.empty(c, F32), np.empty(c, F32)
    for step in range(3):
        x = (2.0 * rng.standard_normal((n, h, w, c)) + step).astype(F32)
        y = np.empty_like(x)
        K.batchnorm_forward_train(x.reshape(-1, c), gamma, beta, y.reshape(-1, c), mean, invstd, rm, rv, momentum, 1e-5)
        y_torch = nhwc(bn(nchw(torch.tensor(x)))).detach().numpy()
        np.testing.assert_allclose(y, y_torch, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rm, bn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv, bn.running_var.numpy(), rtol=1e-5, atol=1e-6)
    bn.eval()
    x = rng.standard_normal((n, h, w, c)).astype(F32)
    y = np.empty_like(x)
    K.batchnorm_forward_eval(x.reshape(-1, c), gamma, beta, rm, rv, 1e-5, y.reshape(-1, c))
    np.testing.assert_allclose(y, nhwc(bn(nchw(torch.tensor(x)))).detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("label_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_kernel_matches_torch(smoothing, label_dtype):
    rng = np.random.default_rng(2)
    logits = (3 * rng.standard_normal((8, 10))).astype(F32)
    labels = rng.integers(0, 10, 8).astype(label_dtype)
    lt = torch.tensor(logits, requires_grad=True)
    loss_torch = F.cross_entropy(lt, torch.tensor(labels.astype(np.int64)), label_smoothing=smoothing)
    loss_torch.backward()
    dlogits = np.empty_like(logits)
    loss = K.softmax_cross_entropy(logits, labels, smoothing, dlogits, 1.0)
    assert loss == pytest.approx(loss_torch.item(), rel=1e-6)
    np.testing.assert_allclose(dlogits, lt.grad.numpy(), rtol=1e-5, atol=1e-7)


SGD_CONFIGS = [
    dict(lr=0.1, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0),
    dict(lr=0.05, momentum=0.9, dampening=0.0, nesterov=False, weight_decay=1e-2),
    dict(lr=0.05, momentum=0.9, dampening=0.25, nesterov=False, weight_decay=1e-3),
    dict(lr=0.02, momentum=0.8, dampening=0.0, nesterov=True, weight_decay=5e-3),
]
ADAM_CONFIGS = [
    (torch.optim.Adam, dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)),
    (torch.optim.Adam, dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    (torch.optim.AdamW, dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)),
]
STEPS = 5


def _torch_steps(optimizer_class, cfg, p0, grads):
    param = torch.nn.Parameter(torch.tensor(p0))
    opt = optimizer_class([param], **cfg)
    for g in grads:
        param.grad = torch.tensor(g)
        opt.step()
    return param.detach().numpy(), opt.state[param]


def _problem(n=64):
    rng = np.random.default_rng(3)
    return rng.standard_normal(n).astype(F32), [rng.standard_normal(n).astype(F32) for _ in range(STEPS)]


@pytest.mark.parametrize("cfg", SGD_CONFIGS, ids=str)
def test_sgd_kernel_matches_torch(cfg):
    p0, grads = _problem()
    p, buf = p0.copy(), np.zeros_like(p0)
    for i, g in enumerate(grads):
        K.sgd_step(p, g, buf, first_step=i == 0, **cfg)
    p_torch, state = _torch_steps(torch.optim.SGD, cfg, p0, grads)
    np.testing.assert_allclose(p, p_torch, rtol=1e-5, atol=1e-6)
    if cfg["momentum"]:
        np.testing.assert_allclose(buf, state["momentum_buffer"].numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer_class,cfg", ADAM_CONFIGS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_adam_kernel_matches_torch(optimizer_class, cfg):
    p0, grads = _problem()
    p, m, v = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
    for step, g in enumerate(grads, start=1):
        K.adam_step(p, g, m, v, cfg["lr"], cfg["betas"][0], cfg["betas"][1], cfg["eps"], cfg["weight_decay"], step,
                    decoupled=optimizer_class is torch.optim.AdamW)
    p_torch, state = _torch_steps(optimizer_class, cfg, p0, grads)
    np.testing.assert_allclose(p, p_torch, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m, state["exp_avg"].numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(v, state["exp_avg_sq"].numpy(), rtol=1e-5, atol=1e-8)
