"""Pointwise activations on flat views, forward and backward side by side.

Every activation of the op table gets its kernels here, generated from its row's float32 scalar pair
(``planner/scalar_activations.py``: ``f(x, alpha)`` and ``f_grad(saved, dy, alpha) -> dx``, the same
bodies the CUDA path compiles): one loop over a span each, so that the loop vectorises. Adding an
activation touches nothing in this file. The backward reads ``saved``: what the row saves, the
*output* where the derivative is a function of it (relu, relu6, sigmoid, tanh), the *input* otherwise.
"""
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from cpu_ref._misc import flat, partition, run_split
from planner.kernel_table import activation_kernels, activation_kernels_of
from planner.ops import OPS, OpRow

_ZERO = np.float32(0.0)


class _Pointwise(NamedTuple):
    forward: tuple     # (span kernel, parallel kernel), as run_split takes them
    backward: tuple


def pointwise(row: OpRow) -> _Pointwise:
    """The kernels of the activation ``row`` (an op-table row with its scalar pair), one loop each, so no
    code chooses among activations at run time."""
    if not row.activation:
        raise ValueError(f"pointwise({row.prim!r}): expected an activation row of the op table (planner/ops.py "
                         f"activation(...)), got a row with activation=False")
    f = njit(inline="always")(row.scalar_forward)
    grad = njit(inline="always")(row.scalar_backward)

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

    return _Pointwise((forward_span, forward_parallel), (backward_span, backward_parallel))


ACTIVATION_KERNELS = activation_kernels(OPS, pointwise)   # Prim -> kernels, every activation row, in table order


def _kernels(prim):
    return activation_kernels_of(ACTIVATION_KERNELS, prim)   # reads the module's table when called


def activation_forward(prim, x, y, alpha):
    """``y = act(x)`` for the activation ``prim``; ``alpha`` is the leaky_relu slope (ignored otherwise)."""
    run_split(*_kernels(prim).forward, x.size, flat(x), flat(y), np.float32(alpha))


def activation_backward(prim, saved, dy, dx, alpha, accumulate):
    """``saved`` is what the op table's row saves: the output or the input."""
    if dx is None:
        return
    run_split(*_kernels(prim).backward, dy.size, flat(saved), flat(dy), flat(dx), np.float32(alpha), accumulate)
