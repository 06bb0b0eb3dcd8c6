"""Max / average / global-average pooling (NHWC), forward and backward side by side.

Max pooling pads with ``-inf`` and records, per output element, the int32 flat index
``(h*W + w)*C + c`` of the winner within its sample (the first maximum in window order).
Average pooling counts the zero padding in the divisor (``count_include_pad=True``).
Backward passes scatter into ``dx`` and are partitioned by sample (windows of one sample
overlap; different samples never do).
"""
import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def _maxpool_forward(x, y, argmax, k, s, p):
    n_, h, w, c = x.shape
    _, oh_, ow_, _ = y.shape
    for row in prange(n_ * oh_):
        n, oh = row // oh_, row % oh_
        for ow in range(ow_):
            best, where = y[n, oh, ow], argmax[n, oh, ow]
            best[:] = -np.inf
            where[:] = 0
            for i in range(k):
                ih = oh * s - p + i
                if ih < 0 or ih >= h:
                    continue
                for j in range(k):
                    iw = ow * s - p + j
                    if iw < 0 or iw >= w:
                        continue
                    xin = x[n, ih, iw]
                    base = (ih * w + iw) * c
                    for ch in range(c):
                        if xin[ch] > best[ch]:
                            best[ch] = xin[ch]
                            where[ch] = base + ch


@njit(cache=True, parallel=True)
def _maxpool_backward(argmax, dy, dx, accumulate):
    n_ = dy.shape[0]
    per = dy.size // n_
    for n in prange(n_):
        dxn = dx[n].reshape(-1)
        if not accumulate:
            dxn[:] = 0.0
        idx, g = argmax[n].reshape(-1), dy[n].reshape(-1)
        for e in range(per):
            dxn[idx[e]] += g[e]


@njit(cache=True, parallel=True)
def _avgpool_forward(x, y, k, s, p):
    n_, h, w, c = x.shape
    _, oh_, ow_, _ = y.shape
    inv = np.float32(1.0 / (k * k))
    for row in prange(n_ * oh_):
        n, oh = row // oh_, row % oh_
        for ow in range(ow_):
            out = y[n, oh, ow]
            out[:] = 0.0
            for i in range(k):
                ih = oh * s - p + i
                if ih < 0 or ih >= h:
                    continue
                for j in range(k):
                    iw = ow * s - p + j
                    if 0 <= iw < w:
                        out += x[n, ih, iw]
            out *= inv


@njit(cache=True, parallel=True)
def _avgpool_backward(dy, dx, k, s, p, accumulate):
    n_, h, w, c = dx.shape
    _, oh_, ow_, _ = dy.shape
    inv = np.float32(1.0 / (k * k))
    for n in prange(n_):
        if not accumulate:
            dx[n] = 0.0
        for oh in range(oh_):
            for ow in range(ow_):
                g = dy[n, oh, ow]
                for i in range(k):
                    ih = oh * s - p + i
                    if ih < 0 or ih >= h:
                        continue
                    for j in range(k):
                        iw = ow * s - p + j
                        if 0 <= iw < w:
                            d = dx[n, ih, iw]
                            for ch in range(c):
                                d[ch] += g[ch] * inv


@njit(cache=True, parallel=True)
def _gap_forward(x, y):
    n_, h, w, c = x.shape
    inv = 1.0 / (h * w)
    for n in prange(n_):
        acc = np.zeros(c)
        for i in range(h):
            for j in range(w):
                xin = x[n, i, j]
                for ch in range(c):
                    acc[ch] += xin[ch]
        for ch in range(c):
            y[n, ch] = acc[ch] * inv


@njit(cache=True, parallel=True)
def _gap_backward(dy, dx, accumulate):
    n_, h, w, c = dx.shape
    inv = np.float32(1.0 / (h * w))
    for n in prange(n_):
        g = dy[n] * inv
        for i in range(h):
            for j in range(w):
                d = dx[n, i, j]
                if accumulate:
                    d += g
                else:
                    d[:] = g


def maxpool_forward(x, y, argmax, k, s, p):
    _maxpool_forward(x, y, argmax, k, s, p)


def maxpool_backward(argmax, dy, dx, accumulate):
    if dx is None:
        return
    _maxpool_backward(argmax, dy, dx, accumulate)


def avgpool_forward(x, y, k, s, p):
    _avgpool_forward(x, y, k, s, p)


def avgpool_backward(dy, dx, k, s, p, accumulate):
    if dx is None:
        return
    _avgpool_backward(dy, dx, k, s, p, accumulate)


def gap_forward(x, y):
    """``y[n, c] = mean over (h, w) of x[n, h, w, c]``."""
    _gap_forward(x, y)


def gap_backward(dy, dx, accumulate):
    if dx is None:
        return
    _gap_backward(dy, dx, accumulate)
