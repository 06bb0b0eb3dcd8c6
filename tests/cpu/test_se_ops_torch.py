"""The fp32 numba kernels of the squeeze-excitation / stochastic-depth primitives against PyTorch fp32.

Each row runs our kernel (fp32) and PyTorch on the same fp32 inputs, forward and backward. The
tolerance comes from float32's own error on that very case: PyTorch fp32 against PyTorch fp64
(``max |torch32 - torch64|``) plus a few float32 rounding units of the result's size; our kernel
must be as close to the fp64 answer as that. (The float64 numpy reference is tied to PyTorch at
1e-10 in test_kernels_torch.py and to these kernels in test_kernels.py.)
"""
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from cpu_ref import kernels as K
from planner import reference as R
from planner.ops import Prim

torch = pytest.importorskip("torch", reason="PyTorch not installed: parity tests need it (pip install torch==2.13.0)")
F = torch.nn.functional

F32 = np.float32
EPS32 = float(np.finfo(F32).eps)
SLACK = 4.0          # our summation order may differ from PyTorch's: allow a few times its own fp32 error


@dataclass(frozen=True)
class Row:
    """``ours(t) -> y`` and ``ours_grad(t, dy) -> {name: grad}`` run our fp32 kernels on numpy;
    ``theirs(t) -> y`` runs PyTorch on tensors (NHWC, any float dtype)."""
    id: str
    shapes: dict
    ours: Callable
    ours_grad: Callable
    theirs: Callable
    scale: float = 1.0   # input spread


def _act(kind, torch_fn):
    def ours(t):
        y = np.empty_like(t["x"])
        K.activation_forward(kind, t["x"], y)
        return y

    def ours_grad(t, dy):
        dx = np.empty_like(t["x"])
        K.activation_backward(kind, t["x"], dy, dx, (), False)   # hardsigmoid saves its input
        return {"x": dx}

    return Row(kind.value, {"x": (3, 5, 4, 6)}, ours, ours_grad, lambda t: torch_fn(t["x"]), scale=4.0)


def _channel_mul(n, h, w, c):
    def ours(t):
        y = np.empty_like(t["x"])
        K.channel_mul_forward(t["x"], t["s"], y)
        return y

    def ours_grad(t, dy):
        dx, ds = np.empty_like(t["x"]), np.empty_like(t["s"])
        K.channel_mul_backward(t["x"], t["s"], dy, dx, ds, False, False)
        return {"x": dx, "s": ds}

    return Row(f"channel_mul_{n}x{h}x{w}x{c}", {"x": (n, h, w, c), "s": (n, c)}, ours, ours_grad,
               lambda t: t["x"] * t["s"][:, None, None, :])


ROWS = [_act(Prim.HARDSIGMOID, F.hardsigmoid), _channel_mul(2, 5, 7, 6), _channel_mul(3, 12, 12, 4)]


def _close(ours, t64, t32, what):
    own_error = float(np.abs(t32 - t64).max(initial=0.0))
    tol = SLACK * own_error + 4 * EPS32 * max(1.0, float(np.abs(t64).max(initial=0.0)))
    worst = float(np.abs(ours.astype(np.float64) - t64).max(initial=0.0))
    assert worst <= tol, f"{what}: max |ours - torch64| = {worst:.3g} > {tol:.3g} (torch fp32's own error {own_error:.3g})"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_fp32_kernel_matches_torch_forward_and_backward(row):
    rng = np.random.default_rng(0)
    t = {name: (row.scale * rng.standard_normal(shape)).astype(F32) for name, shape in row.shapes.items()}
    y = row.ours(t)
    dy = rng.standard_normal(y.shape).astype(F32)
    results = {}
    for dtype in (torch.float32, torch.float64):
        tt = {name: torch.tensor(v, dtype=dtype, requires_grad=True) for name, v in t.items()}
        out = row.theirs(tt)
        out.backward(torch.tensor(dy, dtype=dtype))
        results[dtype] = (out.detach().numpy().astype(np.float64),
                          {name: v.grad.numpy().astype(np.float64) for name, v in tt.items()})
    (y32, g32), (y64, g64) = results[torch.float32], results[torch.float64]
    assert np.abs(y64).max() > 0
    _close(y, y64, y32, f"{row.id} forward")
    grads = row.ours_grad(t, dy)
    assert set(grads) == set(row.shapes)
    for name in row.shapes:
        _close(grads[name], g64[name], g32[name], f"{row.id} d{name}")


# ---- drop_path against torchvision's StochasticDepth(p, "row") ------------------------------------------
@pytest.mark.parametrize("p", [0.2, 0.5])
def test_drop_path_has_torchvisions_stochastic_depth_semantics(p):
    """Both draw per-sample keep flags from their own generators, so the flags differ; what must agree
    is the rest: a dropped sample is all zeros, a kept one is x * float32(1 / (1 - p)) to the bit (torch
    multiplies by its noise 1 / (1 - p)), the gradient follows the same flags, and eval is the identity."""
    from tests.support.torchvision_ref import torchvision_or_skip
    tv = torchvision_or_skip()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 3, 2, 5)).astype(F32)
    y, mask = np.empty_like(x), np.empty(16, np.uint8)
    K.drop_path_forward(x, y, mask, p, seed=3, step=2)
    assert 0 < mask.sum() < 16, "the draw must keep some samples and drop others to check both"
    np.testing.assert_array_equal(mask, R.drop_path_mask(16, p, 3, 2))
    torch.manual_seed(0)
    theirs = tv.ops.stochastic_depth(torch.tensor(x), p, "row", training=True).numpy()
    kept_theirs = np.abs(theirs).reshape(16, -1).max(axis=1) > 0
    assert 0 < kept_theirs.sum() < 16
    both = kept_theirs & mask.astype(bool)
    assert both.any()
    np.testing.assert_array_equal(y[both], theirs[both])
    assert not y[~mask.astype(bool)].any()
    dy = rng.standard_normal(x.shape).astype(F32)
    dx = np.full_like(x, np.nan)
    K.drop_path_backward(mask, dy, dx, p, False)
    np.testing.assert_array_equal(dx, np.where(mask[:, None, None, None] == 1, dy * F32(1 / (1 - p)), F32(0)))
    module = tv.ops.StochasticDepth(p, "row").eval()
    assert torch.equal(module(torch.tensor(x)), torch.tensor(x))


def test_hardsigmoid_at_its_kinks_matches_torch():
    """PyTorch's gradient is 1/6 strictly inside (-3, 3): exactly at -3 and 3 it is 0."""
    x = np.array([-4.0, -3.0, -2.5, 0.0, 2.5, 3.0, 4.0], F32)
    y, dx = np.empty_like(x), np.empty_like(x)
    K.activation_forward(Prim.HARDSIGMOID, x, y)
    K.activation_backward(Prim.HARDSIGMOID, x, np.ones_like(x), dx, (), False)
    t = torch.tensor(x, requires_grad=True)
    F.hardsigmoid(t).sum().backward()
    np.testing.assert_array_equal(y, F.hardsigmoid(torch.tensor(x)).numpy())
    np.testing.assert_allclose(dx, t.grad.numpy(), rtol=1e-7, atol=0)
