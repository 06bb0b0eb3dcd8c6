"""Each activation's scalar pair, written once for both execution paths.

``f(x, alpha) -> y`` and ``f_grad(saved, dy, alpha) -> dx`` on float32 scalars; ``saved`` is what
the activation's op-table row saves (the output where the derivative is a function of it, else the
input), ``alpha`` its one scalar parameter (leaky_relu's slope; ignored by the others). The op-table
row (``planner.ops.activation``) points at the pair, and each path compiles it into its kernels:
``cpu_ref/_activation.py`` with ``numba.njit`` and ``cuda_kernels/_elementwise.py`` with
``numba.cuda.jit(device=True)``. This module imports neither (``tests/null`` runs without numba).

What both compilers take, and so the rules of a body here:
- float32 in, float32 out: constants are ``np.float32`` globals (a bare ``0.5`` is fp64 on the
  device, which ``tests/cuda/test_ptx.py`` rejects); ``math.exp``/``math.tanh``/``math.erf`` on a
  float32 stay float32 in both compilers;
- a body calls only ``math`` functions, ``min`` and ``max``: a call to another plain Python function
  compiles on neither path (``tests/null/test_scalar_activations.py`` checks both rules).
The forms follow PyTorch's fp32 kernels (``x / 6``, not ``x * (1 / 6)``). The numpy reference in
``planner/reference.py`` stays the independent spec both paths are tested against.
"""
import math

import numpy as np

_ZERO = np.float32(0.0)
_ONE = np.float32(1.0)
_HALF = np.float32(0.5)
_THREE = np.float32(3.0)
_SIX = np.float32(6.0)
_INV_SQRT2 = np.float32(1.0 / math.sqrt(2.0))
_INV_SQRT_2PI = np.float32(1.0 / math.sqrt(2.0 * math.pi))


def relu(x, alpha):
    return x if x > _ZERO else _ZERO


def relu_grad(y, dy, alpha):
    return dy if y > _ZERO else _ZERO


def relu6(x, alpha):
    return min(max(x, _ZERO), _SIX)


def relu6_grad(y, dy, alpha):
    return dy if _ZERO < y < _SIX else _ZERO


def leaky_relu(x, alpha):
    return x if x > _ZERO else alpha * x


def leaky_relu_grad(x, dy, alpha):
    return dy if x > _ZERO else alpha * dy


def sigmoid(x, alpha):
    return _ONE / (_ONE + math.exp(-x))


def sigmoid_grad(y, dy, alpha):
    return dy * y * (_ONE - y)


def tanh(x, alpha):
    return math.tanh(x)


def tanh_grad(y, dy, alpha):
    return dy * (_ONE - y * y)


def silu(x, alpha):
    return x / (_ONE + math.exp(-x))


def silu_grad(x, dy, alpha):
    s = _ONE / (_ONE + math.exp(-x))
    return dy * s * (_ONE + x * (_ONE - s))


def hardswish(x, alpha):
    return x * min(max(x + _THREE, _ZERO), _SIX) / _SIX


def hardswish_grad(x, dy, alpha):
    if x < -_THREE:
        return _ZERO
    return dy * (x / _THREE + _HALF) if x <= _THREE else dy


def gelu(x, alpha):
    """The exact erf form (PyTorch's default), as ``erfc``: ``1 + erf(x)`` cancels in float32 for x < -3."""
    return _HALF * x * math.erfc(-x * _INV_SQRT2)


def gelu_grad(x, dy, alpha):
    cdf = _HALF * math.erfc(-x * _INV_SQRT2)
    return dy * (cdf + x * math.exp(-_HALF * x * x) * _INV_SQRT_2PI)


def hardsigmoid(x, alpha):
    return min(max(x + _THREE, _ZERO), _SIX) / _SIX


def hardsigmoid_grad(x, dy, alpha):
    return dy / _SIX if -_THREE < x < _THREE else _ZERO
