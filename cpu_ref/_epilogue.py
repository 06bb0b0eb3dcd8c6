"""The eval forward's convolution epilogue: BatchNorm (running statistics), then optionally the residual add,
then optionally ReLU, applied to each block of a convolution's output rows while the block is still in cache.

Unfused, ``conv -> bn -> add -> relu`` makes four passes over memory-sized tensors after the GEMM: BatchNorm,
add and ReLU are bandwidth-bound and on a 2-core machine gain nothing from the second thread (resnet50 batch 8:
58 of 463 ms). The executor (`cpu_ref._executor`, ``eval_epilogues``) hands such a chain to the convolution as
an `Epilogue` when it runs an eval graph; every kernel of the chain is still the same arithmetic on the same
values, so the result is bit-identical to running them one by one (``tests/cpu/test_eval_epilogue.py``):

- BatchNorm: ``x * scale + shift`` with `eval_scale_shift`'s float32 ``scale`` and ``shift``, as
  `cpu_ref._norm.batchnorm_forward_eval` computes them;
- add: ``bn + residual`` (float addition commutes exactly, so the add's operand order does not matter);
- ReLU: the op table's scalar ``relu`` (``planner.scalar_activations``), as the activation kernel runs it.

``src`` (the convolution's rows) and ``out`` (the chain's last output) are ``(rows, C)``; they may be the same
rows of the same array (the epilogue reads each element before it writes it), never overlapping otherwise.
"""
from typing import NamedTuple

import numpy as np
from numba import njit

from planner.scalar_activations import relu as _scalar_relu

relu_scalar = njit(cache=True, inline="always")(_scalar_relu)   # cache=True: every kernel of cpu_ref is cached
_ZERO = np.float32(0.0)


class Epilogue(NamedTuple):
    """What a convolution applies to its output rows before writing them to ``out``."""
    scale: np.ndarray       # (C,) float32: BatchNorm's gamma / sqrt(running_var + eps)
    shift: np.ndarray       # (C,) float32: beta - running_mean * scale
    residual: np.ndarray    # (rows, C), added after BatchNorm; (0, 0) for none
    relu: bool
    out: np.ndarray         # (rows, C): the chain's output
    scratch: bool           # out shares no memory with the convolution's own output: its rows may hold a block


#: The kernels' argument for "no epilogue": every array empty (one compiled signature either way).
NONE = Epilogue(np.zeros(0, np.float32), np.zeros(0, np.float32), np.zeros((0, 0), np.float32), False,
                np.zeros((0, 0), np.float32), False)


def eval_scale_shift(gamma, beta, running_mean, running_var, eps):
    """BatchNorm's eval transform as ``y = x * scale + shift`` (float32), the one both paths apply."""
    scale = (gamma / np.sqrt(running_var.astype(np.float64) + eps)).astype(np.float32)
    return scale, beta - running_mean * scale


@njit(cache=True)
def apply_rows(src, s0, out, r0, r1, scale, shift, residual, relu):
    """``out[r0:r1] = relu?(src[s0:s0 + r1 - r0] * scale + shift (+ residual[r0:r1]))``; each branch is its own
    loop, so that each vectorises."""
    c = out.shape[1]
    for i in range(r1 - r0):
        s, o = src[s0 + i], out[r0 + i]
        if residual.shape[0] > 0:
            q = residual[r0 + i]
            if relu:
                for j in range(c):
                    o[j] = relu_scalar(s[j] * scale[j] + shift[j] + q[j], _ZERO, _ZERO)
            else:
                for j in range(c):
                    o[j] = s[j] * scale[j] + shift[j] + q[j]
        elif relu:
            for j in range(c):
                o[j] = relu_scalar(s[j] * scale[j] + shift[j], _ZERO, _ZERO)
        else:
            for j in range(c):
                o[j] = s[j] * scale[j] + shift[j]
