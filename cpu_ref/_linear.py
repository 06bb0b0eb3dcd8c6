"""Fully connected layer, ``y = x @ W.T + b`` with ``W`` of shape ``(out, in)`` (PyTorch's layout).

Whole-matrix products go straight to numpy's ``matmul`` (its BLAS parallelises itself);
only the bias reduction is a numba kernel.
"""
import numpy as np
from numba import njit, prange

from cpu_ref._misc import partition, partitions, run_partitioned


@njit(cache=True)
def _column_sums_span(a, parts, t, nparts):
    """``parts[t]`` = the column sums of partition ``t``'s rows, in float64."""
    lo, hi = partition(a.shape[0], t, nparts)
    out = parts[t]
    for ch in range(out.size):
        out[ch] = 0.0
    for r in range(lo, hi):
        ar = a[r]
        for ch in range(out.size):
            out[ch] += ar[ch]


@njit(cache=True, parallel=True)
def _column_sums_parallel(a, parts, nparts):
    for t in prange(nparts):
        _column_sums_span(a, parts, t, nparts)


def _column_sums(a, out):
    """``out = a.sum(axis=0)``: float64 partials per partition, added in partition order."""
    nparts = partitions(a.shape[0])
    parts = np.empty((nparts, a.shape[1]))
    run_partitioned(_column_sums_span, _column_sums_parallel, nparts, a.size, a, parts)
    out[:] = parts.sum(axis=0)


def linear_forward(x2d, w, b, y):
    np.matmul(x2d, w.T, out=y)
    if b is not None:
        y += b


def linear_backward(x2d, w, dy, dx, dw, db, accumulate):
    """``dw = dy.T @ x`` and ``db = dy.sum(0)`` (overwritten); ``dx = dy @ W`` (skipped when ``None``)."""
    np.matmul(dy.T, x2d, out=dw)
    if db is not None:
        _column_sums(dy, db)
    if dx is None:
        return
    if accumulate:
        dx += dy @ w
    else:
        np.matmul(dy, w, out=dx)
