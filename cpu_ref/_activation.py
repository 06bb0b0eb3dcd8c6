"""Pointwise activations on flat views, forward and backward side by side.

The backward reads ``saved``: the *output* for the codes in ``ACTIVATION_SAVES_OUTPUT``
(their derivative is a function of it, so the input need not be kept), the *input*
otherwise. GELU is the exact erf form (PyTorch's default). Each activation is a pair of
scalar functions, ``f(x, alpha)`` and ``grad(saved, dy, alpha) -> dx``; the kernels
apply one over a span in a loop of its own, so that the loop vectorises.
"""
import math

import numpy as np
from numba import njit, prange

from cpu_ref._misc import flat, partition, run_split

RELU, RELU6, LEAKY_RELU, SIGMOID, TANH, SILU, HARDSWISH, GELU, HARDSIGMOID = range(9)
ACTIVATION_SAVES_OUTPUT = frozenset({RELU, RELU6, SIGMOID, TANH})

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


@njit(cache=True)
def _forward_span(code, x, y, alpha, t, nparts):
    lo, hi = partition(x.size, t, nparts)
    x, y = x[lo:hi], y[lo:hi]
    n = x.size
    if code == RELU:
        for i in range(n):
            y[i] = _relu(x[i], alpha)
    elif code == RELU6:
        for i in range(n):
            y[i] = _relu6(x[i], alpha)
    elif code == LEAKY_RELU:
        for i in range(n):
            y[i] = _leaky_relu(x[i], alpha)
    elif code == SIGMOID:
        for i in range(n):
            y[i] = _sigmoid(x[i], alpha)
    elif code == TANH:
        for i in range(n):
            y[i] = _tanh(x[i], alpha)
    elif code == SILU:
        for i in range(n):
            y[i] = _silu(x[i], alpha)
    elif code == HARDSWISH:
        for i in range(n):
            y[i] = _hardswish(x[i], alpha)
    elif code == HARDSIGMOID:
        for i in range(n):
            y[i] = _hardsigmoid(x[i], alpha)
    else:
        for i in range(n):
            y[i] = _gelu(x[i], alpha)


@njit(cache=True)
def _backward_span(code, s, dy, dx, alpha, accumulate, t, nparts):
    lo, hi = partition(dy.size, t, nparts)
    s, dy, dx = s[lo:hi], dy[lo:hi], dx[lo:hi]
    n = dy.size
    if code == RELU:
        for i in range(n):
            dx[i] = _relu_grad(s[i], dy[i], alpha) + (dx[i] if accumulate else _ZERO)
    elif code == RELU6:
        for i in range(n):
            dx[i] = _relu6_grad(s[i], dy[i], alpha) + (dx[i] if accumulate else _ZERO)
    elif code == LEAKY_RELU:
        for i in range(n):
            dx[i] = _leaky_relu_grad(s[i], dy[i], alpha) + (dx[i] if accumulate else _ZERO)
    elif code == SIGMOID:
        for i in range(n):
            dx[i] = _sigmoid_grad(s[i], dy[i], alpha) + (dx[i] if accumulate else _ZERO)
    elif code == TANH:
        for i in range(n):
            dx[i] = _tanh_grad(s[i], dy[i], alpha) + (dx[i] if accumulate else _ZERO)
    elif code == SILU:
        for i in range(n):
            dx[i] = _silu_grad(s[i], dy[i], alpha) + (dx[i] if accumulate else _ZERO)
    elif code == HARDSWISH:
        for i in range(n):
            dx[i] = _hardswish_grad(s[i], dy[i], alpha) + (dx[i] if accumulate else _ZERO)
    elif code == HARDSIGMOID:
        for i in range(n):
            dx[i] = _hardsigmoid_grad(s[i], dy[i], alpha) + (dx[i] if accumulate else _ZERO)
    else:
        for i in range(n):
            dx[i] = _gelu_grad(s[i], dy[i], alpha) + (dx[i] if accumulate else _ZERO)


@njit(cache=True, parallel=True)
def _forward_parallel(code, x, y, alpha, nparts):
    for t in prange(nparts):
        _forward_span(code, x, y, alpha, t, nparts)


@njit(cache=True, parallel=True)
def _backward_parallel(code, saved, dy, dx, alpha, accumulate, nparts):
    for t in prange(nparts):
        _backward_span(code, saved, dy, dx, alpha, accumulate, t, nparts)


def activation_forward(code, x, y, alpha):
    """``y = act(x)``; ``alpha`` is the leaky_relu slope (ignored otherwise)."""
    run_split(_forward_span, _forward_parallel, x.size, code, flat(x), flat(y), np.float32(alpha))


def activation_backward(code, saved, dy, dx, alpha, accumulate):
    if dx is None:
        return
    run_split(_backward_span, _backward_parallel, dy.size, code, flat(saved), flat(dy), flat(dx), np.float32(alpha),
              accumulate)
