"""Elementwise glue: add / accumulate_into, inverted dropout, channel zero-padding.

Also the rule every kernel of ``cpu_ref`` follows to use the thread pool. A kernel is a
serial numba function over one static partition ``t`` of ``nparts`` (a "span"), and a thin
``prange`` wrapper that runs all partitions at once. Work below ``PARALLEL_MIN_ELEMENTS``
runs the spans in the calling thread instead: a parallel region wakes and joins every
thread of the pool, which costs more than a small tensor's work, and on a machine whose
cores are busy with other processes a join can wait for a whole scheduler time slice. A
model that only has small tensors then never even compiles a parallel wrapper.

Where the rounding depends on the split (partial sums, BLAS row blocks), the partitions
are the same whether or not they run concurrently (``run_partitioned``): results depend on
the thread count only, never on the size threshold.
"""
import numba
import numpy as np
from numba import njit, prange, uint64

#: Below this many elements (or element-sized units of work) a kernel runs its partitions in the
#: calling thread. A parallel region (passive OpenMP waits) cost about 9 us at 2 threads, while an
#: elementwise pass over 2^18 float32 takes 35-70 us on one core (an add, from L2 or L3): below
#: that, waking the pool gains little. At 2^21 (the value until issue 27) every BatchNorm, ReLU and
#: add of resnet20 b128 after its first stage and most of resnet50 b8's ran on one thread of two,
#: 23% of resnet20's 2-thread step. Each parallel wrapper costs a second compilation of its kernel.
PARALLEL_MIN_ELEMENTS = 1 << 18


def _concurrent(work):
    return work >= PARALLEL_MIN_ELEMENTS and numba.get_num_threads() > 1


def run_split(span, parallel, size, *args):
    """Work whose result does not depend on the split: ``span(*args, 0, 1)`` over all of it,
    or, for ``size`` elements or more, ``parallel(*args, nparts)`` across the thread pool."""
    if _concurrent(size):
        return parallel(*args, numba.get_num_threads())
    return span(*args, 0, 1)


def partitions(units):
    """How many partitions work of ``units`` indivisible units (rows, samples) is split into:
    one per thread of the pool, a function of the thread count only."""
    return max(1, min(numba.get_num_threads(), units))


def run_partitioned(span, parallel, nparts, work, *args):
    """Work whose rounding depends on the split: ``span(*args, t, nparts)`` for each of the
    ``nparts`` partitions (``partitions(...)``) one after another, or all at once through
    ``parallel(*args, nparts)`` when ``work`` is large. Either way the result is the same."""
    if nparts > 1 and _concurrent(work):
        parallel(*args, nparts)
    else:
        for t in range(nparts):
            span(*args, t, nparts)


def flat(a):
    """The 1-D view of a C-contiguous array (never a copy)."""
    if not a.flags.c_contiguous:
        raise ValueError(f"cpu_ref kernels expect C-contiguous arrays; got strides {a.strides} for shape {a.shape}")
    return a.reshape(-1)


@njit(cache=True, inline="always")
def partition(n, t, nparts):
    """Bounds of partition ``t``'s span of ``range(n)``. Kernels loop over ``view[lo:hi]`` from 0:
    a loop index numba knows is non-negative needs no wraparound check and vectorises."""
    per = (n + nparts - 1) // nparts
    return min(n, t * per), min(n, (t + 1) * per)


@njit(cache=True, inline="always")
def window(o, k, s, p, size):
    """The taps ``[lo, hi)`` of a ``k``-wide window at output position ``o`` (stride ``s``,
    padding ``p``) that fall inside an input of ``size``; tap ``i`` reads input ``o*s - p + i``.
    Pooling and convolution loops visit exactly these taps instead of testing every one."""
    start = o * s - p
    return max(0, -start), max(0, min(k, size - start))


# ---------------------------------------------------------------------------- add / accumulate_into

@njit(cache=True)
def _add_span(a, b, y, t, nparts):
    lo, hi = partition(y.size, t, nparts)
    av, bv, yv = a[lo:hi], b[lo:hi], y[lo:hi]
    for i in range(yv.size):
        yv[i] = av[i] + bv[i]


@njit(cache=True, parallel=True)
def _add_parallel(a, b, y, nparts):
    for t in prange(nparts):
        _add_span(a, b, y, t, nparts)


@njit(cache=True)
def _copy_or_add(dst, src, accumulate):
    if accumulate:
        for i in range(dst.size):
            dst[i] += src[i]
    else:
        for i in range(dst.size):
            dst[i] = src[i]


@njit(cache=True)
def _accumulate_span(dst, src, accumulate, t, nparts):
    lo, hi = partition(dst.size, t, nparts)
    _copy_or_add(dst[lo:hi], src[lo:hi], accumulate)


@njit(cache=True, parallel=True)
def _accumulate_parallel(dst, src, accumulate, nparts):
    for t in prange(nparts):
        _accumulate_span(dst, src, accumulate, t, nparts)


def add_forward(a, b, y):
    """``y = a + b`` (the residual join)."""
    run_split(_add_span, _add_parallel, y.size, flat(a), flat(b), flat(y))


def accumulate_into(dst, src, accumulate):
    """``dst = src`` or ``dst += src``: the backward of ``add`` for one operand."""
    if dst is None:
        return
    run_split(_accumulate_span, _accumulate_parallel, dst.size, flat(dst), flat(src), accumulate)


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


@njit(cache=True)
def _dropout_forward_span(x, y, mask, p, scale, seed, step, t, nparts):
    key = _mix64(seed * _GOLDEN + step)
    lo, hi = partition(x.size, t, nparts)
    xv, yv, mv = x[lo:hi], y[lo:hi], mask[lo:hi]
    for i in range(xv.size):
        keep = _uniform(key, lo + i) >= p
        mv[i] = keep
        yv[i] = xv[i] * scale if keep else np.float32(0.0)


@njit(cache=True, parallel=True)
def _dropout_forward_parallel(x, y, mask, p, scale, seed, step, nparts):
    for t in prange(nparts):
        _dropout_forward_span(x, y, mask, p, scale, seed, step, t, nparts)


@njit(cache=True)
def _dropout_backward_span(mask, dy, dx, scale, accumulate, t, nparts):
    lo, hi = partition(dy.size, t, nparts)
    mv, gv, dv = mask[lo:hi], dy[lo:hi], dx[lo:hi]
    for i in range(dv.size):
        dv[i] = (gv[i] * scale if mv[i] else np.float32(0.0)) + (dv[i] if accumulate else np.float32(0.0))


@njit(cache=True, parallel=True)
def _dropout_backward_parallel(mask, dy, dx, scale, accumulate, nparts):
    for t in prange(nparts):
        _dropout_backward_span(mask, dy, dx, scale, accumulate, t, nparts)


def _dropout_scale(p):
    return np.float32(1.0 / (1.0 - p) if p < 1.0 else 0.0)


def dropout_forward(x, y, mask, p, seed, step):
    """Inverted dropout: keep element ``i`` iff ``reference.dropout_uniform(seed, step, i) >= p``."""
    run_split(_dropout_forward_span, _dropout_forward_parallel, x.size, flat(x), flat(y), flat(mask), float(p),
              _dropout_scale(p), np.uint64(seed & _MASK64), np.uint64(step & _MASK64))


def dropout_backward(mask, dy, dx, p, accumulate):
    if dx is None:
        return
    run_split(_dropout_backward_span, _dropout_backward_parallel, dy.size, flat(mask), flat(dy), flat(dx),
              _dropout_scale(p), accumulate)


# ---------------------------------------------------------------------------- channel_pad

@njit(cache=True)
def _channel_pad_forward_span(x2d, y2d, t, nparts):
    c, c_out = x2d.shape[1], y2d.shape[1]
    lo, hi = partition(x2d.shape[0], t, nparts)
    for r in range(lo, hi):
        xr, yr = x2d[r], y2d[r]
        for ch in range(c):
            yr[ch] = xr[ch]
        for ch in range(c, c_out):
            yr[ch] = 0.0


@njit(cache=True, parallel=True)
def _channel_pad_forward_parallel(x2d, y2d, nparts):
    for t in prange(nparts):
        _channel_pad_forward_span(x2d, y2d, t, nparts)


@njit(cache=True)
def _channel_pad_backward_span(dy2d, dx2d, accumulate, t, nparts):
    lo, hi = partition(dx2d.shape[0], t, nparts)
    for r in range(lo, hi):
        _copy_or_add(dx2d[r], dy2d[r], accumulate)


@njit(cache=True, parallel=True)
def _channel_pad_backward_parallel(dy2d, dx2d, accumulate, nparts):
    for t in prange(nparts):
        _channel_pad_backward_span(dy2d, dx2d, accumulate, t, nparts)


def channel_pad_forward(x, y):
    """``y[..., :C] = x``, zeros in the channels after (last axis; NHWC or 2-D)."""
    run_split(_channel_pad_forward_span, _channel_pad_forward_parallel, y.size, flat(x).reshape(-1, x.shape[-1]),
              flat(y).reshape(-1, y.shape[-1]))


def channel_pad_backward(dy, dx, accumulate):
    if dx is None:
        return
    run_split(_channel_pad_backward_span, _channel_pad_backward_parallel, dy.size, flat(dy).reshape(-1, dy.shape[-1]),
              flat(dx).reshape(-1, dx.shape[-1]), accumulate)
