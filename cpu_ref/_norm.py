"""Batch normalisation on the 2-D view ``(M, C)`` (``M = N*H*W``, or ``N`` for BN1d).

Training normalises with the biased batch variance and moves ``running_var`` toward the
unbiased one (``M / (M - 1)``), ``running = (1 - momentum) * running + momentum * batch``,
as ``torch.nn.BatchNorm``. Per-channel sums are accumulated in float64, one partial per
worker, combined in a fixed order.

With few channels a per-row inner loop is too short to vectorise, so the kernels walk
blocks of ``B`` whole rows as one flat vector of ``B*C`` elements against per-channel
vectors tiled ``B`` times (``_tiled``), and finish the leftover rows one by one.
"""
import numpy as np
from numba import njit, prange

from cpu_ref._misc import partition, workers_for

#: Elements per flat block (rounded down to whole rows).
BLOCK_ELEMENTS = 256


def _rows_per_block(c):
    return max(1, BLOCK_ELEMENTS // c)


def _tiled(v, c):
    return np.tile(np.asarray(v, np.float32), _rows_per_block(c))


@njit(cache=True, parallel=True)
def _channel_sums(a, b, rows_per_block, nworkers):
    """Per channel ``(sum a, sum a*b)`` over rows, in float64; ``b is None`` means ``b = a``."""
    m, c = a.shape
    width = rows_per_block * c
    s1 = np.zeros((nworkers, c))
    s2 = np.zeros((nworkers, c))
    for t in prange(nworkers):
        lo, hi = partition(m, t, nworkers)
        af = a[lo:hi].reshape(-1)
        bf = af if b is None else b[lo:hi].reshape(-1)
        acc1, acc2 = np.zeros(width), np.zeros(width)
        full = (hi - lo) // rows_per_block * width
        for start in range(0, full, width):
            ab, bb = af[start:start + width], bf[start:start + width]
            for e in range(width):
                v = np.float64(ab[e])
                acc1[e] += v
                acc2[e] += v * bb[e]
        for start in range(full, af.size, c):
            ab, bb = af[start:start + c], bf[start:start + c]
            for e in range(c):
                v = np.float64(ab[e])
                acc1[e] += v
                acc2[e] += v * bb[e]
        for k in range(rows_per_block):
            s1[t] += acc1[k * c:(k + 1) * c]
            s2[t] += acc2[k * c:(k + 1) * c]
    return s1.sum(axis=0), s2.sum(axis=0)


@njit(cache=True, parallel=True)
def _scale_shift(x2d, scale_t, shift_t, y2d, nworkers):
    """``y = x * scale + shift`` per channel (``*_t``: the per-channel vectors tiled)."""
    m, c = x2d.shape
    width = scale_t.size
    for t in prange(nworkers):
        lo, hi = partition(m, t, nworkers)
        xf, yf = x2d[lo:hi].reshape(-1), y2d[lo:hi].reshape(-1)
        for start in range(0, xf.size, width):
            xb, yb = xf[start:start + width], yf[start:start + width]
            for e in range(xb.size):
                yb[e] = xb[e] * scale_t[e] + shift_t[e]


def batchnorm_forward_train(x2d, gamma, beta, y2d, save_mean, save_invstd, running_mean, running_var, momentum, eps):
    m, c = x2d.shape
    total, total_sq = _channel_sums(x2d, None, _rows_per_block(c), workers_for(x2d.size))
    mean = total / m
    var = np.maximum(total_sq / m - mean * mean, 0.0)
    invstd = 1.0 / np.sqrt(var + eps)
    save_mean[:] = mean
    save_invstd[:] = invstd
    running_mean[:] = (1 - momentum) * running_mean + momentum * mean
    running_var[:] = (1 - momentum) * running_var + momentum * (var * (m / max(m - 1, 1)))
    scale = (gamma * invstd).astype(np.float32)
    _scale_shift(x2d, _tiled(scale, c), _tiled(beta - mean * scale, c), y2d, workers_for(x2d.size))


def batchnorm_forward_eval(x2d, gamma, beta, running_mean, running_var, eps, y2d):
    c = x2d.shape[1]
    scale = (gamma / np.sqrt(running_var.astype(np.float64) + eps)).astype(np.float32)
    _scale_shift(x2d, _tiled(scale, c), _tiled(beta - running_mean * scale, c), y2d, workers_for(x2d.size))


@njit(cache=True, parallel=True)
def _batchnorm_dx(x2d, dy2d, dx2d, mean_t, invstd_t, k_dy_t, k_mean_t, k_xhat_t, accumulate, nworkers):
    """``dx = k_dy*dy - k_mean - k_xhat*xhat`` per channel, ``xhat = (x - mean) * invstd``."""
    m, c = x2d.shape
    width = mean_t.size
    for t in prange(nworkers):
        lo, hi = partition(m, t, nworkers)
        xf, gf, df = x2d[lo:hi].reshape(-1), dy2d[lo:hi].reshape(-1), dx2d[lo:hi].reshape(-1)
        for start in range(0, xf.size, width):
            xb, gb, db = xf[start:start + width], gf[start:start + width], df[start:start + width]
            for e in range(xb.size):
                v = k_dy_t[e] * gb[e] - k_mean_t[e] - k_xhat_t[e] * ((xb[e] - mean_t[e]) * invstd_t[e])
                db[e] = v + (db[e] if accumulate else np.float32(0.0))


def batchnorm_backward(x2d, gamma, save_mean, save_invstd, dy2d, dx2d, dgamma, dbeta, accumulate):
    """``dx = gamma*invstd/M * (M*dy - sum(dy) - xhat*sum(dy*xhat))``; ``dgamma``, ``dbeta`` overwritten."""
    m, c = x2d.shape
    nworkers = workers_for(x2d.size)
    sum_dy, sum_dy_x = _channel_sums(dy2d, x2d, _rows_per_block(c), nworkers)
    invstd = save_invstd.astype(np.float64)
    sum_dy_xhat = (sum_dy_x - save_mean * sum_dy) * invstd
    dbeta[:] = sum_dy
    dgamma[:] = sum_dy_xhat
    if dx2d is None:
        return
    k_dy = gamma * invstd
    _batchnorm_dx(x2d, dy2d, dx2d, _tiled(save_mean, c), _tiled(save_invstd, c), _tiled(k_dy, c),
                  _tiled(k_dy * sum_dy / m, c), _tiled(k_dy * sum_dy_xhat / m, c), accumulate, nworkers)
