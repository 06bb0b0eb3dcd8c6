"""Pointwise activations on flat views, forward and backward side by side.

The backward reads ``saved``: what the activation's op-table row saves, the *output* where the
derivative is a function of it (relu, relu6, sigmoid, tanh), the *input* otherwise. GELU is
the exact erf form (PyTorch's default). Each activation is a pair of scalar functions,
``f(x, alpha)`` and ``grad(saved, dy, alpha) -> dx``, registered with ``pointwise``, which
generates its kernels: one loop over a span each, so that the loop vectorises.
"""
import math
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from cpu_ref._misc import flat, partition, run_split
from planner.ops import OPS, Prim


class _Pointwise(NamedTuple):
    forward: tuple     # (span kernel, parallel kernel), as run_split takes them
    backward: tuple


ACTIVATION_KERNELS: dict[Prim, _Pointwise] = {}   # filled by pointwise(), one entry per activation

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_THREE = np.float32(3.0)
_SIX = np.float32(6.0)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@njit(cache=True, inline="always")
def _relu(x, alpha):
    return x if x > _ZERO else _ZERO


@njit(cache=True, inline="always")
def _relu_grad(y, g, alpha):
    return g if y > _ZERO else _ZERO


@njit(cache=True, inline="always")
def _relu6(x, alpha):
    return min(max(x, _ZERO), _SIX)


@njit(cache=True, inline="always")
def _relu6_grad(y, g, alpha):
    return g if _ZERO < y < _SIX else _ZERO


@njit(cache=True, inline="always")
def _leaky_relu(x, alpha):
    return x if x > _ZERO else alpha * x


@njit(cache=True, inline="always")
def _leaky_relu_grad(x, g, alpha):
    return g if x > _ZERO else alpha * g


@njit(cache=True, inline="always")
def _sigmoid(x, alpha):
    return _ONE / (_ONE + np.exp(-x))


@njit(cache=True, inline="always")
def _sigmoid_grad(y, g, alpha):
    return g * y * (_ONE - y)


@njit(cache=True, inline="always")
def _tanh(x, alpha):
    return np.tanh(x)


@njit(cache=True, inline="always")
def _tanh_grad(y, g, alpha):
    return g * (_ONE - y * y)


@njit(cache=True, inline="always")
def _silu(x, alpha):
    return x / (_ONE + np.exp(-x))


@njit(cache=True, inline="always")
def _silu_grad(x, g, alpha):
    s = _ONE / (_ONE + np.exp(-x))
    return g * s * (_ONE + x * (_ONE - s))


@njit(cache=True, inline="always")
def _hardswish(x, alpha):
    return x * min(max(x + _THREE, _ZERO), _SIX) / _SIX


@njit(cache=True, inline="always")
def _hardswish_grad(x, g, alpha):
    if x < -_THREE:
        return _ZERO
    return g * (x / _THREE + _HALF) if x <= _THREE else g


@njit(cache=True, inline="always")
def _hardsigmoid(x, alpha):
    return min(max(x + _THREE, _ZERO), _SIX) / _SIX


@njit(cache=True, inline="always")
def _hardsigmoid_grad(x, g, alpha):
    return g / _SIX if -_THREE < x < _THREE else _ZERO


@njit(cache=True, inline="always")
def _gelu(x, alpha):
    return np.float32(0.5 * x * (1.0 + math.erf(x * _INV_SQRT2)))


@njit(cache=True, inline="always")
def _gelu_grad(x, g, alpha):
    cdf = 0.5 * (1.0 + math.erf(x * _INV_SQRT2))
    return np.float32(g * (cdf + x * _INV_SQRT_2PI * math.exp(-0.5 * x * x)))


def pointwise(prim: Prim, f, grad) -> None:
    """Register the activation ``prim`` (a row of the op table): its forward and backward kernels are
    generated from the scalar pair, one loop each, so no code chooses among activations at run time."""
    if not OPS[prim].activation:
        raise ValueError(f"pointwise({prim!r}): the op table row is not an activation (planner/ops.py)")

    @njit(cache=True)
    def forward_span(x, y, alpha, t, nparts):
        lo, hi = partition(x.size, t, nparts)
        x, y = x[lo:hi], y[lo:hi]
        for i in range(x.size):
            y[i] = f(x[i], alpha)

    @njit(cache=True)
    def backward_span(s, dy, dx, alpha, accumulate, t, nparts):
        lo, hi = partition(dy.size, t, nparts)
        s, dy, dx = s[lo:hi], dy[lo:hi], dx[lo:hi]
        for i in range(dy.size):
            dx[i] = grad(s[i], dy[i], alpha) + (dx[i] if accumulate else _ZERO)

    @njit(cache=True, parallel=True)
    def forward_parallel(x, y, alpha, nparts):
        for t in prange(nparts):
            forward_span(x, y, alpha, t, nparts)

    @njit(cache=True, parallel=True)
    def backward_parallel(s, dy, dx, alpha, accumulate, nparts):
        for t in prange(nparts):
            backward_span(s, dy, dx, alpha, accumulate, t, nparts)

    ACTIVATION_KERNELS[prim] = _Pointwise((forward_span, forward_parallel), (backward_span, backward_parallel))


pointwise(Prim.RELU, _relu, _relu_grad)
pointwise(Prim.RELU6, _relu6, _relu6_grad)
pointwise(Prim.LEAKY_RELU, _leaky_relu, _leaky_relu_grad)
pointwise(Prim.SIGMOID, _sigmoid, _sigmoid_grad)
pointwise(Prim.TANH, _tanh, _tanh_grad)
pointwise(Prim.SILU, _silu, _silu_grad)
pointwise(Prim.HARDSWISH, _hardswish, _hardswish_grad)
pointwise(Prim.GELU, _gelu, _gelu_grad)
pointwise(Prim.HARDSIGMOID, _hardsigmoid, _hardsigmoid_grad)


def _kernels(prim):
    kernels = ACTIVATION_KERNELS.get(prim)
    if kernels is None:
        raise ValueError(f"activation kernel: expected one of {[p.value for p in ACTIVATION_KERNELS]}, got {prim!r}; "
                         f"a new activation registers its scalar pair with pointwise(...) in cpu_ref/_activation.py")
    return kernels


def activation_forward(prim, x, y, alpha):
    """``y = act(x)`` for the activation ``prim``; ``alpha`` is the leaky_relu slope (ignored otherwise)."""
    run_split(*_kernels(prim).forward, x.size, flat(x), flat(y), np.float32(alpha))


def activation_backward(prim, saved, dy, dx, alpha, accumulate):
    """``saved`` is what the op table's row saves: the output or the input."""
    if dx is None:
        return
    run_split(*_kernels(prim).backward, dy.size, flat(saved), flat(dy), flat(dx), np.float32(alpha), accumulate)
