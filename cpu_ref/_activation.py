"""Pointwise activations on flat views, forward and backward side by side.

The backward reads ``saved``: the *output* for the codes in ``ACTIVATION_SAVES_OUTPUT``
(their derivative is a function of it, so the input need not be kept), the *input*
otherwise. GELU is the exact erf form (PyTorch's default).
"""
import math

import numpy as np
from numba import njit, prange

from cpu_ref._misc import flat, partition, workers_for

RELU, RELU6, LEAKY_RELU, SIGMOID, TANH, SILU, HARDSWISH, GELU = range(8)
ACTIVATION_SAVES_OUTPUT = frozenset({RELU, RELU6, SIGMOID, TANH})

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_THREE = np.float32(3.0)
_SIX = np.float32(6.0)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@njit(cache=True, inline="always")
def _sigmoid(v):
    return _ONE / (_ONE + np.exp(-v))


@njit(cache=True, inline="always")
def _forward_one(code, v, alpha):
    if code == RELU:
        return v if v > _ZERO else _ZERO
    if code == RELU6:
        return min(max(v, _ZERO), _SIX)
    if code == LEAKY_RELU:
        return v if v > _ZERO else alpha * v
    if code == SIGMOID:
        return _sigmoid(v)
    if code == TANH:
        return np.tanh(v)
    if code == SILU:
        return v * _sigmoid(v)
    if code == HARDSWISH:
        return v * min(max(v + _THREE, _ZERO), _SIX) / _SIX
    # GELU
    return np.float32(0.5 * v * (1.0 + math.erf(v * _INV_SQRT2)))


@njit(cache=True, inline="always")
def _derivative_one(code, s, alpha):
    """d(activation)/dx as a function of ``saved``."""
    if code == RELU:
        return _ONE if s > _ZERO else _ZERO
    if code == RELU6:
        return _ONE if _ZERO < s < _SIX else _ZERO
    if code == LEAKY_RELU:
        return _ONE if s > _ZERO else alpha
    if code == SIGMOID:
        return s * (_ONE - s)
    if code == TANH:
        return _ONE - s * s
    if code == SILU:
        sg = _sigmoid(s)
        return sg * (_ONE + s * (_ONE - sg))
    if code == HARDSWISH:
        if s < -_THREE:
            return _ZERO
        return s / _THREE + _HALF if s <= _THREE else _ONE
    # GELU
    return np.float32(0.5 * (1.0 + math.erf(s * _INV_SQRT2)) + s * _INV_SQRT_2PI * math.exp(-0.5 * s * s))


@njit(cache=True, parallel=True)
def _activation_forward(code, x, y, alpha, nworkers):
    for t in prange(nworkers):
        lo, hi = partition(x.size, t, nworkers)
        for i in range(lo, hi):
            y[i] = _forward_one(code, x[i], alpha)


@njit(cache=True, parallel=True)
def _activation_backward(code, saved, dy, dx, alpha, accumulate, nworkers):
    for t in prange(nworkers):
        lo, hi = partition(dy.size, t, nworkers)
        if accumulate:
            for i in range(lo, hi):
                dx[i] += dy[i] * _derivative_one(code, saved[i], alpha)
        else:
            for i in range(lo, hi):
                dx[i] = dy[i] * _derivative_one(code, saved[i], alpha)


def activation_forward(code, x, y, alpha):
    """``y = act(x)``; ``alpha`` is the leaky_relu slope (ignored otherwise)."""
    _activation_forward(code, flat(x), flat(y), np.float32(alpha), workers_for(x.size))


def activation_backward(code, saved, dy, dx, alpha, accumulate):
    if dx is None:
        return
    _activation_backward(code, flat(saved), flat(dy), flat(dx), np.float32(alpha), accumulate, workers_for(dy.size))
