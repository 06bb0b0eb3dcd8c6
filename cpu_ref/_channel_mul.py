"""channel_mul: an NHWC tensor times one value per sample and channel (the squeeze-excitation scale).

``y[n, h, w, c] = x[n, h, w, c] * s[n, c]``; backward ``dx = dy * s`` and
``ds[n, c] = sum_{h, w} dy * x`` (fp32, summed in h, w order). Spans split the samples, so a
sample's sums never depend on the thread count.
"""
import numpy as np
from numba import njit, prange

from cpu_ref._misc import partition, run_split

_ZERO = np.float32(0.0)


@njit(cache=True)
def _forward_span(x, s, y, t, nparts):
    lo, hi = partition(x.shape[0], t, nparts)
    for n in range(lo, hi):
        for h in range(x.shape[1]):
            for w in range(x.shape[2]):
                for c in range(x.shape[3]):
                    y[n, h, w, c] = x[n, h, w, c] * s[n, c]


@njit(cache=True, parallel=True)
def _forward_parallel(x, s, y, nparts):
    for t in prange(nparts):
        _forward_span(x, s, y, t, nparts)


@njit(cache=True)
def _backward_span(x, s, dy, dx, ds, want_dx, accumulate_dx, want_ds, accumulate_ds, t, nparts):
    lo, hi = partition(x.shape[0], t, nparts)
    channels = x.shape[3]
    total = np.empty(channels, np.float32)
    for n in range(lo, hi):
        total[:] = _ZERO
        for h in range(x.shape[1]):
            for w in range(x.shape[2]):
                for c in range(channels):
                    g = dy[n, h, w, c]
                    total[c] += g * x[n, h, w, c]
                    if want_dx:
                        dx[n, h, w, c] = g * s[n, c] + (dx[n, h, w, c] if accumulate_dx else _ZERO)
        if want_ds:
            for c in range(channels):
                ds[n, c] = total[c] + (ds[n, c] if accumulate_ds else _ZERO)


@njit(cache=True, parallel=True)
def _backward_parallel(x, s, dy, dx, ds, want_dx, accumulate_dx, want_ds, accumulate_ds, nparts):
    for t in prange(nparts):
        _backward_span(x, s, dy, dx, ds, want_dx, accumulate_dx, want_ds, accumulate_ds, t, nparts)


def channel_mul_forward(x, s, y):
    """``y = x * s[:, None, None, :]`` for NHWC ``x`` and ``s`` of shape (N, C)."""
    run_split(_forward_span, _forward_parallel, x.size, x, s, y)


def channel_mul_backward(x, s, dy, dx, ds, accumulate_dx, accumulate_ds):
    """``dx`` (like ``x``) and ``ds`` (like ``s``) may each be None (no gradient wanted)."""
    if dx is None and ds is None:
        return
    run_split(_backward_span, _backward_parallel, x.size, x, s, dy, dy if dx is None else dx,
              s if ds is None else ds, dx is not None, accumulate_dx, ds is not None, accumulate_ds)
