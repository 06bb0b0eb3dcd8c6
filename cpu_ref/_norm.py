"""Batch normalisation on the 2-D view ``(M, C)`` (``M = N*H*W``, or ``N`` for BN1d).

Training normalises with the biased batch variance and moves ``running_var`` toward the
unbiased one (``M / (M - 1)``), ``running = (1 - momentum) * running + momentum * batch``,
as ``torch.nn.BatchNorm``. Per-channel sums are accumulated in float64, one partial per
worker, combined in a fixed order.
"""
import numpy as np
from numba import njit, prange

from cpu_ref._misc import partition, workers_for


@njit(cache=True, parallel=True)
def _channel_sums(a, b, nworkers):
    """Per channel ``(sum a, sum a*b)`` over rows, float64; ``b is None`` means ``b = a``."""
    m, c = a.shape
    s1 = np.zeros((nworkers, c))
    s2 = np.zeros((nworkers, c))
    for t in prange(nworkers):
        lo, hi = partition(m, t, nworkers)
        p1, p2 = s1[t], s2[t]
        for r in range(lo, hi):
            ar = a[r]
            if b is None:
                for ch in range(c):
                    v = np.float64(ar[ch])
                    p1[ch] += v
                    p2[ch] += v * v
            else:
                br = b[r]
                for ch in range(c):
                    v = np.float64(ar[ch])
                    p1[ch] += v
                    p2[ch] += v * br[ch]
    return s1.sum(axis=0), s2.sum(axis=0)


@njit(cache=True, parallel=True)
def _scale_shift(x2d, scale, shift, y2d, nworkers):
    """``y = x * scale + shift`` per channel."""
    m, c = x2d.shape
    for t in prange(nworkers):
        lo, hi = partition(m, t, nworkers)
        for r in range(lo, hi):
            xr, yr = x2d[r], y2d[r]
            for ch in range(c):
                yr[ch] = xr[ch] * scale[ch] + shift[ch]


def batchnorm_forward_train(x2d, gamma, beta, y2d, save_mean, save_invstd, running_mean, running_var, momentum, eps):
    m = x2d.shape[0]
    total, total_sq = _channel_sums(x2d, None, workers_for(x2d.size))
    mean = total / m
    var = np.maximum(total_sq / m - mean * mean, 0.0)
    invstd = 1.0 / np.sqrt(var + eps)
    save_mean[:] = mean
    save_invstd[:] = invstd
    running_mean[:] = (1 - momentum) * running_mean + momentum * mean
    running_var[:] = (1 - momentum) * running_var + momentum * (var * (m / max(m - 1, 1)))
    scale = (gamma * invstd).astype(np.float32)
    _scale_shift(x2d, scale, (beta - mean * scale).astype(np.float32), y2d, workers_for(x2d.size))


def batchnorm_forward_eval(x2d, gamma, beta, running_mean, running_var, eps, y2d):
    scale = (gamma / np.sqrt(running_var.astype(np.float64) + eps)).astype(np.float32)
    _scale_shift(x2d, scale, (beta - running_mean * scale).astype(np.float32), y2d, workers_for(x2d.size))


@njit(cache=True, parallel=True)
def _batchnorm_dx(x2d, dy2d, dx2d, mean, invstd, k_dy, k_mean, k_xhat, accumulate, nworkers):
    """``dx = k_dy*dy - k_mean - k_xhat*xhat`` per channel, ``xhat = (x - mean) * invstd``."""
    m, c = x2d.shape
    for t in prange(nworkers):
        lo, hi = partition(m, t, nworkers)
        for r in range(lo, hi):
            xr, gr, dr = x2d[r], dy2d[r], dx2d[r]
            for ch in range(c):
                v = k_dy[ch] * gr[ch] - k_mean[ch] - k_xhat[ch] * ((xr[ch] - mean[ch]) * invstd[ch])
                if accumulate:
                    dr[ch] += v
                else:
                    dr[ch] = v


def batchnorm_backward(x2d, gamma, save_mean, save_invstd, dy2d, dx2d, dgamma, dbeta, accumulate):
    """``dx = gamma*invstd/M * (M*dy - sum(dy) - xhat*sum(dy*xhat))``; ``dgamma``, ``dbeta`` overwritten."""
    m = x2d.shape[0]
    nworkers = workers_for(x2d.size)
    sum_dy, sum_dy_x = _channel_sums(dy2d, x2d, nworkers)
    invstd = save_invstd.astype(np.float64)
    sum_dy_xhat = (sum_dy_x - save_mean * sum_dy) * invstd
    dbeta[:] = sum_dy
    dgamma[:] = sum_dy_xhat
    if dx2d is None:
        return
    k_dy = gamma * invstd
    _batchnorm_dx(x2d, dy2d, dx2d, save_mean, save_invstd, k_dy.astype(np.float32),
                  (k_dy * sum_dy / m).astype(np.float32), (k_dy * sum_dy_xhat / m).astype(np.float32),
                  accumulate, nworkers)
