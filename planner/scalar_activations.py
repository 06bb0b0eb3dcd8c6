"""Each activation's scalar pair, written once for both execution paths.

``f(x, a, b) -> y`` and ``f_grad(saved, dy, a, b) -> dx`` on float32 scalars; ``saved`` is what
the activation's op-table row saves (the output where the derivative is a function of it, else the
input). ``a`` and ``b`` are the row's ``attrs`` in their order (``ACTIVATION_SLOTS`` of them; a row with
fewer leaves the rest unused), and a pair names them so: ``softplus(x, beta, threshold)``,
``leaky_relu(x, slope, _b)``, ``relu(x, _a, _b)`` (``tests/null/test_scalar_activations.py`` checks the
names against the row). The op-table
row (``planner.ops.activation``) points at the pair, and each path compiles it into its kernels:
``cpu_ref/_activation.py`` with ``numba.njit`` and ``cuda_kernels/elementwise.py`` with
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
_SELU_ALPHA = np.float32(1.6732632423543772848170429916717)
_SELU_SCALE = np.float32(1.0507009873554804934193349852946)


def relu(x, _a, _b):
    return x if x > _ZERO else _ZERO


def relu_grad(y, dy, _a, _b):
    return dy if y > _ZERO else _ZERO


def relu6(x, _a, _b):
    return min(max(x, _ZERO), _SIX)


def relu6_grad(y, dy, _a, _b):
    return dy if _ZERO < y < _SIX else _ZERO


def leaky_relu(x, slope, _b):
    return x if x > _ZERO else slope * x


def leaky_relu_grad(x, dy, slope, _b):
    return dy if x > _ZERO else slope * dy


def sigmoid(x, _a, _b):
    return _ONE / (_ONE + math.exp(-x))


def sigmoid_grad(y, dy, _a, _b):
    return dy * y * (_ONE - y)


def tanh(x, _a, _b):
    return math.tanh(x)


def tanh_grad(y, dy, _a, _b):
    return dy * (_ONE - y * y)


def silu(x, _a, _b):
    return x / (_ONE + math.exp(-x))


def silu_grad(x, dy, _a, _b):
    s = _ONE / (_ONE + math.exp(-x))
    return dy * s * (_ONE + x * (_ONE - s))


def hardswish(x, _a, _b):
    return x * min(max(x + _THREE, _ZERO), _SIX) / _SIX


def hardswish_grad(x, dy, _a, _b):
    if x < -_THREE:
        return _ZERO
    return dy * (x / _THREE + _HALF) if x <= _THREE else dy


def gelu(x, _a, _b):
    """The exact erf form (PyTorch's default), as ``erfc``: ``1 + erf(x)`` cancels in float32 for x < -3."""
    return _HALF * x * math.erfc(-x * _INV_SQRT2)


def gelu_grad(x, dy, _a, _b):
    cdf = _HALF * math.erfc(-x * _INV_SQRT2)
    return dy * (cdf + x * math.exp(-_HALF * x * x) * _INV_SQRT_2PI)


def hardsigmoid(x, _a, _b):
    return min(max(x + _THREE, _ZERO), _SIX) / _SIX


def hardsigmoid_grad(x, dy, _a, _b):
    return dy / _SIX if -_THREE < x < _THREE else _ZERO


def elu(x, alpha, _b):
    return x if x > _ZERO else alpha * math.expm1(x)


def elu_grad(x, dy, alpha, _b):
    return dy if x > _ZERO else dy * alpha * math.exp(x)


def celu(x, alpha, _b):
    return x if x > _ZERO else alpha * math.expm1(x / alpha)


def celu_grad(x, dy, alpha, _b):
    return dy if x > _ZERO else dy * math.exp(x / alpha)


def selu(x, _a, _b):
    return _SELU_SCALE * (x if x > _ZERO else _SELU_ALPHA * math.expm1(x))


def selu_grad(x, dy, _a, _b):
    return dy * _SELU_SCALE if x > _ZERO else dy * _SELU_SCALE * _SELU_ALPHA * math.exp(x)


def softplus(x, beta, threshold):
    """PyTorch's: linear above ``threshold`` (in units of ``beta * x``), where exp would overflow."""
    return x if x * beta > threshold else math.log1p(math.exp(x * beta)) / beta


def softplus_grad(x, dy, beta, threshold):
    return dy if x * beta > threshold else dy / (_ONE + math.exp(-x * beta))


def mish(x, _a, _b):
    return x * math.tanh(math.log1p(math.exp(x)))


def mish_grad(x, dy, _a, _b):
    s = _ONE / (_ONE + math.exp(-x))
    t = math.tanh(math.log1p(math.exp(x)))
    return dy * (t + x * s * (_ONE - t * t))


def hardtanh(x, max_val, min_val):
    return min(max(x, min_val), max_val)


def hardtanh_grad(x, dy, max_val, min_val):
    return dy if min_val < x < max_val else _ZERO
