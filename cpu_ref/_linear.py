"""Fully connected layer, ``y = x @ W.T + b`` with ``W`` of shape ``(out, in)`` (PyTorch's layout).

Whole-matrix products go straight to numpy's ``matmul`` (its BLAS parallelises itself);
only the bias reduction is a numba kernel.
"""
import numpy as np
from numba import njit, prange

from cpu_ref._misc import partition, workers_for


@njit(cache=True, parallel=True)
def _column_sums(a, out, nworkers):
    """``out = a.sum(axis=0)``, float64 partials per worker."""
    m, c = a.shape
    parts = np.zeros((nworkers, c))
    for t in prange(nworkers):
        lo, hi = partition(m, t, nworkers)
        part = parts[t]
        for r in range(lo, hi):
            ar = a[r]
            for ch in range(c):
                part[ch] += ar[ch]
    out[:] = parts.sum(axis=0)


def linear_forward(x2d, w, b, y):
    np.matmul(x2d, w.T, out=y)
    if b is not None:
        y += b


def linear_backward(x2d, w, dy, dx, dw, db, accumulate):
    """``dw = dy.T @ x`` and ``db = dy.sum(0)`` (overwritten); ``dx = dy @ W`` (skipped when ``None``)."""
    np.matmul(dy.T, x2d, out=dw)
    if db is not None:
        _column_sums(dy, db, workers_for(dy.size))
    if dx is None:
        return
    if accumulate:
        dx += dy @ w
    else:
        np.matmul(dy, w, out=dx)
