"""Batch normalisation on the 2-D view ``(M, C)`` (``M = N*H*W``, or ``N`` for BN1d).

Training normalises with the biased batch variance and moves ``running_var`` toward the
unbiased one (``M / (M - 1)``), ``running = (1 - momentum) * running + momentum * batch``,
as ``torch.nn.BatchNorm``. Per-channel sums are accumulated in float64, one partial per
worker, combined in a fixed order.

With few channels a per-row inner loop is too short to vectorise, so the elementwise passes
walk blocks of ``B`` whole rows as one flat vector of ``B*C`` elements against per-channel
vectors tiled ``B`` times (``_tiled``), and finish the leftover rows one by one. The
statistics view the data as rows of ``lcm(C, STRIP)`` columns instead and keep their float64
sums in registers (``_strip_sums``): sums held in a numba array cost a load and a store per
add, which made the statistics pass about 1.8x slower than a copy of the same data in cache
(1.3x in registers). numba's disk cache checks this file only: an edit of
``_simd.float64_sums`` must come with one here (or a cleared cache).
"""
import math

import numpy as np
from numba import njit, prange

from cpu_ref._epilogue import eval_scale_shift, relu_scalar
from cpu_ref._misc import partition, partitions, run_partitioned, run_split
from cpu_ref._simd import VECTOR_REGISTERS, float64_sums

#: Elements per flat block (rounded down to whole rows).
BLOCK_ELEMENTS = 256


def _rows_per_block(c):
    return max(1, BLOCK_ELEMENTS // c)


def _tiled(v, c):
    return np.tile(np.asarray(v, np.float32), _rows_per_block(c))


#: float64 lanes per vector (a zmm, or two ymm) and vectors per sum the statistics keep in registers: AVX-512's 32
#: registers hold 2 x 4 zmm and the loads, AVX2's 16 hold 2 x 2 pairs of ymm.
_LANES = 8
_VECTORS = 4 if VECTOR_REGISTERS == 32 else 2
#: Columns one pass of the statistics sums in registers: 32 float32 (AVX-512) or 16 (AVX2).
STRIP = _LANES * _VECTORS
#: Bytes of each input a pass over the strips of a chunk of rows reads: the registers are added into the float64 sums
#: in memory once per chunk and strip.
CHUNK_BYTES = 16384
_alloc, _zero, _add, _add_product, _add_into = float64_sums(_LANES, _VECTORS)


def lane_columns(c):
    """Columns of the 2-D view the statistics sum: the least multiple of both ``c`` and `STRIP`, so that column
    ``j`` of every row of it holds channel ``j % c`` and a strip of columns is whole vectors."""
    return math.lcm(c, STRIP)


@njit(cache=True)
def _strip_sums(af, bf, cols, chunk_rows, acc1, acc2):
    """``acc1[j] += sum a[:, j]``, ``acc2[j] += sum a[:, j] * b[:, j]`` over the whole rows of the flat ``af``, ``bf``
    viewed as ``(rows, cols)`` (``cols`` a multiple of `STRIP`), summed in float64 registers one strip and one
    chunk of rows at a time; the leftover elements (fewer than a row) go to ``acc[:leftover]`` one by one."""
    rows = af.size // cols
    s1, s2 = _alloc(), _alloc()
    for r0 in range(0, rows, chunk_rows):
        r1 = min(rows, r0 + chunk_rows)
        for j in range(0, cols, STRIP):
            for q in range(_VECTORS):
                _zero(s1, q)
                _zero(s2, q)
            for r in range(r0, r1):
                base = r * cols + j
                for q in range(_VECTORS):
                    _add(s1, q, af, base + q * _LANES)
                    _add_product(s2, q, af, bf, base + q * _LANES)
            for q in range(_VECTORS):
                _add_into(s1, q, acc1, j + q * _LANES)
                _add_into(s2, q, acc2, j + q * _LANES)
    for e in range(rows * cols, af.size):
        v = np.float64(af[e])
        acc1[e - rows * cols] += v
        acc2[e - rows * cols] += v * np.float64(bf[e])


@njit(cache=True)
def _channel_sums_span(a, b, cols, s1, s2, t, nparts):
    """Partition ``t``'s per-channel ``s1[t] = sum a`` and ``s2[t] = sum a*b`` over its rows, in float64;
    ``cols``: `lane_columns`."""
    c = a.shape[1]
    lo, hi = partition(a.shape[0], t, nparts)
    acc1, acc2 = np.zeros(cols), np.zeros(cols)
    _strip_sums(a[lo:hi].reshape(-1), b[lo:hi].reshape(-1), cols, max(1, CHUNK_BYTES // (4 * cols)), acc1, acc2)
    for ch in range(c):
        s1[t, ch] = 0.0
        s2[t, ch] = 0.0
        for k in range(cols // c):
            s1[t, ch] += acc1[k * c + ch]
            s2[t, ch] += acc2[k * c + ch]


@njit(cache=True, parallel=True)
def _channel_sums_parallel(a, b, cols, s1, s2, nparts):
    for t in prange(nparts):
        _channel_sums_span(a, b, cols, s1, s2, t, nparts)


def _channel_sums(a, b):
    """Per channel ``(sum a, sum a*b)`` over the rows of ``(M, C)`` arrays, in float64; one
    partial per partition, added in partition order."""
    m, c = a.shape
    nparts = partitions(m)
    s1, s2 = np.empty((nparts, c)), np.empty((nparts, c))
    run_partitioned(_channel_sums_span, _channel_sums_parallel, nparts, a.size, a, b, lane_columns(c), s1, s2)
    return s1.sum(axis=0), s2.sum(axis=0)


@njit(cache=True)
def _scale_shift_span(x2d, scale_t, shift_t, y2d, t, nparts):
    """``y = x * scale + shift`` per channel (``*_t``: the per-channel vectors tiled)."""
    lo, hi = partition(x2d.shape[0], t, nparts)
    width = scale_t.size
    xf, yf = x2d[lo:hi].reshape(-1), y2d[lo:hi].reshape(-1)
    for start in range(0, xf.size, width):
        xb, yb = xf[start:start + width], yf[start:start + width]
        for e in range(xb.size):
            yb[e] = xb[e] * scale_t[e] + shift_t[e]


@njit(cache=True, parallel=True)
def _scale_shift_parallel(x2d, scale_t, shift_t, y2d, nparts):
    for t in prange(nparts):
        _scale_shift_span(x2d, scale_t, shift_t, y2d, t, nparts)


def _scale_shift(x2d, scale, shift, y2d):
    c = x2d.shape[1]
    run_split(_scale_shift_span, _scale_shift_parallel, x2d.size, x2d, _tiled(scale, c), _tiled(shift, c), y2d)


@njit(cache=True)
def _chain_span(x2d, scale_t, shift_t, residual, relu, y2d, t, nparts):
    """``y = relu?(x * scale + shift (+ residual))``, as `_scale_shift_span`, then the add and ReLU kernels, compute
    it (``residual``: ``(M, C)``, or ``(0, 0)`` for none); each branch is its own loop, so that each vectorises."""
    lo, hi = partition(x2d.shape[0], t, nparts)
    width = scale_t.size
    xf, yf = x2d[lo:hi].reshape(-1), y2d[lo:hi].reshape(-1)
    rf = residual[lo:hi].reshape(-1) if residual.shape[0] > 0 else residual.reshape(-1)
    zero = np.float32(0.0)
    for start in range(0, xf.size, width):
        xb, yb = xf[start:start + width], yf[start:start + width]
        if rf.size > 0:
            rb = rf[start:start + width]
            if relu:
                for e in range(xb.size):
                    yb[e] = relu_scalar(xb[e] * scale_t[e] + shift_t[e] + rb[e], zero, zero)
            else:
                for e in range(xb.size):
                    yb[e] = xb[e] * scale_t[e] + shift_t[e] + rb[e]
        else:   # no residual: ReLU (`batchnorm_forward_train` sends BatchNorm alone to `_scale_shift`)
            for e in range(xb.size):
                yb[e] = relu_scalar(xb[e] * scale_t[e] + shift_t[e], zero, zero)


@njit(cache=True, parallel=True)
def _chain_parallel(x2d, scale_t, shift_t, residual, relu, y2d, nparts):
    for t in prange(nparts):
        _chain_span(x2d, scale_t, shift_t, residual, relu, y2d, t, nparts)


def local_channel_sums(count, s1, s2):
    """The per-channel sums BN normalises with: this replica's own (``(count, s1, s2)`` unchanged).
    Synchronised BN (`blueprint.distributed`) passes a function that sums them over every replica."""
    return count, s1, s2


#: `batchnorm_forward_train`'s ``residual`` for none.
NO_RESIDUAL = np.zeros((0, 0), np.float32)


def batchnorm_forward_train(x2d, gamma, beta, y2d, save_mean, save_invstd, running_mean, running_var, momentum, eps,
                            reduce_sums=local_channel_sums, residual=NO_RESIDUAL, relu=False):
    """Training BatchNorm of ``x2d`` into ``y2d``; with a ``residual`` ``(M, C)`` and/or ``relu``, ``y2d`` gets
    ``relu?(bn(x) + residual)`` in the same pass, bit-identical to the add and ReLU kernels run after it (a training
    graph's ``bn [-> add] [-> relu]`` chain, `cpu_ref._executor`). ``y2d`` may be ``residual``'s rows, not ``x2d``'s."""
    m, c = x2d.shape
    m, total, total_sq = reduce_sums(m, *_channel_sums(x2d, x2d))
    mean = total / m
    var = np.maximum(total_sq / m - mean * mean, 0.0)
    invstd = 1.0 / np.sqrt(var + eps)
    save_mean[:] = mean
    save_invstd[:] = invstd
    running_mean[:] = (1 - momentum) * running_mean + momentum * mean
    running_var[:] = (1 - momentum) * running_var + momentum * (var * (m / max(m - 1, 1)))
    scale = (gamma * invstd).astype(np.float32)
    if residual.shape[0] == 0 and not relu:
        _scale_shift(x2d, scale, beta - mean * scale, y2d)
        return
    run_split(_chain_span, _chain_parallel, x2d.size, x2d, _tiled(scale, c), _tiled(beta - mean * scale, c), residual,
              relu, y2d)


def batchnorm_forward_eval(x2d, gamma, beta, running_mean, running_var, eps, y2d):
    _scale_shift(x2d, *eval_scale_shift(gamma, beta, running_mean, running_var, eps), y2d)


@njit(cache=True)
def _batchnorm_dx_span(x2d, dy2d, dx2d, mean_t, invstd_t, k_dy_t, k_mean_t, k_xhat_t, accumulate, t, nparts):
    """``dx = k_dy*dy - k_mean - k_xhat*xhat`` per channel, ``xhat = (x - mean) * invstd``."""
    lo, hi = partition(x2d.shape[0], t, nparts)
    width = mean_t.size
    xf, gf, df = x2d[lo:hi].reshape(-1), dy2d[lo:hi].reshape(-1), dx2d[lo:hi].reshape(-1)
    for start in range(0, xf.size, width):
        xb, gb, db = xf[start:start + width], gf[start:start + width], df[start:start + width]
        for e in range(xb.size):
            v = k_dy_t[e] * gb[e] - k_mean_t[e] - k_xhat_t[e] * ((xb[e] - mean_t[e]) * invstd_t[e])
            db[e] = v + (db[e] if accumulate else np.float32(0.0))


@njit(cache=True, parallel=True)
def _batchnorm_dx_parallel(x2d, dy2d, dx2d, mean_t, invstd_t, k_dy_t, k_mean_t, k_xhat_t, accumulate, nparts):
    for t in prange(nparts):
        _batchnorm_dx_span(x2d, dy2d, dx2d, mean_t, invstd_t, k_dy_t, k_mean_t, k_xhat_t, accumulate, t, nparts)


def batchnorm_backward(x2d, gamma, save_mean, save_invstd, dy2d, dx2d, dgamma, dbeta, accumulate,
                       reduce_sums=local_channel_sums):
    """``dx = gamma*invstd/M * (M*dy - sum(dy) - xhat*sum(dy*xhat))``; ``dgamma``, ``dbeta`` overwritten
    with this replica's sums (its gradients, reduced with all others); ``dx`` uses ``reduce_sums``'s."""
    m, c = x2d.shape
    sum_dy, sum_dy_x = _channel_sums(dy2d, x2d)
    invstd = save_invstd.astype(np.float64)
    dbeta[:] = sum_dy
    dgamma[:] = (sum_dy_x - save_mean * sum_dy) * invstd
    if dx2d is None:
        return
    m, sum_dy, sum_dy_x = reduce_sums(m, sum_dy, sum_dy_x)
    sum_dy_xhat = (sum_dy_x - save_mean * sum_dy) * invstd
    k_dy = gamma * invstd
    run_split(_batchnorm_dx_span, _batchnorm_dx_parallel, x2d.size, x2d, dy2d, dx2d, _tiled(save_mean, c),
              _tiled(save_invstd, c), _tiled(k_dy, c), _tiled(k_dy * sum_dy / m, c), _tiled(k_dy * sum_dy_xhat / m, c),
              accumulate)
