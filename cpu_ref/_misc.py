"""Elementwise glue: add / accumulate_into, inverted dropout, channel zero-padding.

Also the worker-count rule every parallel kernel of ``cpu_ref`` uses: a kernel splits its
work into ``nworkers`` static, contiguous partitions (``prange(nworkers)``), so a result
never depends on thread scheduling; tiny tensors run in one partition, because waking
the thread pool costs more than the work.
"""
import numba
import numpy as np
from numba import njit, prange, uint64

#: Below this many elements a kernel runs as a single partition.
PARALLEL_MIN_ELEMENTS = 1 << 15


def workers_for(size):
    return numba.get_num_threads() if size >= PARALLEL_MIN_ELEMENTS else 1


def flat(a):
    """The 1-D view of a C-contiguous array (never a copy)."""
    if not a.flags.c_contiguous:
        raise ValueError(f"cpu_ref kernels expect C-contiguous arrays; got strides {a.strides} for shape {a.shape}")
    return a.reshape(-1)


@njit(cache=True, inline="always")
def partition(n, t, nworkers):
    """Bounds of worker ``t``'s span of ``range(n)``. Kernels loop over ``view[lo:hi]`` from 0:
    a loop index numba knows is non-negative needs no wraparound check and vectorises."""
    per = (n + nworkers - 1) // nworkers
    return min(n, t * per), min(n, (t + 1) * per)


# ---------------------------------------------------------------------------- add / accumulate_into

@njit(cache=True, parallel=True)
def _add(a, b, y, nworkers):
    for t in prange(nworkers):
        lo, hi = partition(y.size, t, nworkers)
        av, bv, yv = a[lo:hi], b[lo:hi], y[lo:hi]
        for i in range(yv.size):
            yv[i] = av[i] + bv[i]


@njit(cache=True, parallel=True)
def _accumulate_into(dst, src, accumulate, nworkers):
    for t in prange(nworkers):
        lo, hi = partition(dst.size, t, nworkers)
        dv, sv = dst[lo:hi], src[lo:hi]
        if accumulate:
            for i in range(dv.size):
                dv[i] += sv[i]
        else:
            for i in range(dv.size):
                dv[i] = sv[i]


def add_forward(a, b, y):
    """``y = a + b`` (the residual join)."""
    _add(flat(a), flat(b), flat(y), workers_for(y.size))


def accumulate_into(dst, src, accumulate):
    """``dst = src`` or ``dst += src``: the backward of ``add`` for one operand."""
    if dst is None:
        return
    _accumulate_into(flat(dst), flat(src), accumulate, workers_for(dst.size))


# ---------------------------------------------------------------------------- dropout

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1
_TWO_POW_MINUS_53 = 2.0 ** -53


@njit(cache=True, inline="always")
def _mix64(z):
    z = (z ^ (z >> uint64(30))) * _MIX1
    z = (z ^ (z >> uint64(27))) * _MIX2
    return z ^ (z >> uint64(31))


@njit(cache=True, inline="always")
def _uniform(key, i):
    """``reference.dropout_uniform`` for one element, given ``key = mix64(seed*GOLDEN + step)``."""
    z = _mix64(key + (uint64(i) + uint64(1)) * _GOLDEN)
    return np.float64(z >> uint64(11)) * _TWO_POW_MINUS_53


@njit(cache=True, parallel=True)
def _dropout_forward(x, y, mask, p, scale, seed, step, nworkers):
    key = _mix64(seed * _GOLDEN + step)
    for t in prange(nworkers):
        lo, hi = partition(x.size, t, nworkers)
        xv, yv, mv = x[lo:hi], y[lo:hi], mask[lo:hi]
        for i in range(xv.size):
            keep = _uniform(key, lo + i) >= p
            mv[i] = keep
            yv[i] = xv[i] * scale if keep else np.float32(0.0)


@njit(cache=True, parallel=True)
def _dropout_backward(mask, dy, dx, scale, accumulate, nworkers):
    for t in prange(nworkers):
        lo, hi = partition(dy.size, t, nworkers)
        mv, gv, dv = mask[lo:hi], dy[lo:hi], dx[lo:hi]
        for i in range(dv.size):
            dv[i] = (gv[i] * scale if mv[i] else np.float32(0.0)) + (dv[i] if accumulate else np.float32(0.0))


def _dropout_scale(p):
    return np.float32(1.0 / (1.0 - p) if p < 1.0 else 0.0)


def dropout_forward(x, y, mask, p, seed, step):
    """Inverted dropout: keep element ``i`` iff ``reference.dropout_uniform(seed, step, i) >= p``."""
    _dropout_forward(flat(x), flat(y), flat(mask), float(p), _dropout_scale(p), np.uint64(seed & _MASK64),
                     np.uint64(step & _MASK64), workers_for(x.size))


def dropout_backward(mask, dy, dx, p, accumulate):
    if dx is None:
        return
    _dropout_backward(flat(mask), flat(dy), flat(dx), _dropout_scale(p), accumulate, workers_for(dy.size))


# ---------------------------------------------------------------------------- channel_pad

@njit(cache=True, parallel=True)
def _channel_pad_forward(x2d, y2d, nworkers):
    c = x2d.shape[1]
    for t in prange(nworkers):
        lo, hi = partition(x2d.shape[0], t, nworkers)
        for r in range(lo, hi):
            y2d[r, :c] = x2d[r]
            y2d[r, c:] = 0.0


@njit(cache=True, parallel=True)
def _channel_pad_backward(dy2d, dx2d, accumulate, nworkers):
    c = dx2d.shape[1]
    for t in prange(nworkers):
        lo, hi = partition(dx2d.shape[0], t, nworkers)
        for r in range(lo, hi):
            if accumulate:
                dx2d[r] += dy2d[r, :c]
            else:
                dx2d[r] = dy2d[r, :c]


def channel_pad_forward(x, y):
    """``y[..., :C] = x``, zeros in the channels after (last axis; NHWC or 2-D)."""
    _channel_pad_forward(flat(x).reshape(-1, x.shape[-1]), flat(y).reshape(-1, y.shape[-1]), workers_for(y.size))


def channel_pad_backward(dy, dx, accumulate):
    if dx is None:
        return
    _channel_pad_backward(flat(dy).reshape(-1, dy.shape[-1]), flat(dx).reshape(-1, dx.shape[-1]), accumulate,
                          workers_for(dy.size))
