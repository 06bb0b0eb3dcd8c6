"""Max / average / global-average pooling (NHWC), forward and backward side by side.

Max pooling pads with ``-inf`` and records, per output element, the int32 flat index
``(h*W + w)*C + c`` of the winner within its sample (the first maximum in window order).
Average pooling counts the zero padding in the divisor (``count_include_pad=True``).
Forward passes split the output rows ``(n, oh)`` between workers; backward passes scatter
into ``dx`` and split by sample (windows of one sample overlap; different samples never do).
"""
import numpy as np
from numba import njit, prange

from cpu_ref._misc import partition, run_split, window


# ---------------------------------------------------------------------------- max pooling

@njit(cache=True)
def _maxpool_forward_span(x, y, argmax, k, s, p, t, nparts):
    """Partition ``t`` of the output rows ``r = n*OH + oh``."""
    _, h, w, c = x.shape
    n_, oh_, ow_, _ = y.shape
    r0, r1 = partition(n_ * oh_, t, nparts)
    for r in range(r0, r1):
        n, oh = r // oh_, r % oh_
        ilo, ihi = window(oh, k, s, p, h)
        for ow in range(ow_):
            jlo, jhi = window(ow, k, s, p, w)
            best, where = y[n, oh, ow], argmax[n, oh, ow]
            best[:] = -np.inf
            where[:] = 0
            for i in range(ilo, ihi):
                for j in range(jlo, jhi):
                    ih, iw = oh * s - p + i, ow * s - p + j
                    xin = x[n, ih, iw]
                    base = (ih * w + iw) * c
                    for ch in range(c):
                        if xin[ch] > best[ch]:
                            best[ch] = xin[ch]
                            where[ch] = base + ch


@njit(cache=True, parallel=True)
def _maxpool_forward_parallel(x, y, argmax, k, s, p, nparts):
    for t in prange(nparts):
        _maxpool_forward_span(x, y, argmax, k, s, p, t, nparts)


@njit(cache=True)
def _maxpool_backward_span(argmax, dy, dx, accumulate, t, nparts):
    per = dy.size // dy.shape[0]
    lo, hi = partition(dy.shape[0], t, nparts)
    for n in range(lo, hi):
        dxn = dx[n].reshape(-1)
        if not accumulate:
            dxn[:] = 0.0
        idx, g = argmax[n].reshape(-1), dy[n].reshape(-1)
        for e in range(per):
            dxn[idx[e]] += g[e]


@njit(cache=True, parallel=True)
def _maxpool_backward_parallel(argmax, dy, dx, accumulate, nparts):
    for t in prange(nparts):
        _maxpool_backward_span(argmax, dy, dx, accumulate, t, nparts)


# ---------------------------------------------------------------------------- average pooling

@njit(cache=True)
def _avgpool_forward_span(x, y, k, s, p, t, nparts):
    _, h, w, c = x.shape
    n_, oh_, ow_, _ = y.shape
    inv = np.float32(1.0 / (k * k))
    r0, r1 = partition(n_ * oh_, t, nparts)
    for r in range(r0, r1):
        n, oh = r // oh_, r % oh_
        ilo, ihi = window(oh, k, s, p, h)
        for ow in range(ow_):
            jlo, jhi = window(ow, k, s, p, w)
            out = y[n, oh, ow]
            out[:] = 0.0
            for i in range(ilo, ihi):
                for j in range(jlo, jhi):
                    xin = x[n, oh * s - p + i, ow * s - p + j]
                    for ch in range(c):
                        out[ch] += xin[ch]
            for ch in range(c):
                out[ch] *= inv


@njit(cache=True, parallel=True)
def _avgpool_forward_parallel(x, y, k, s, p, nparts):
    for t in prange(nparts):
        _avgpool_forward_span(x, y, k, s, p, t, nparts)


@njit(cache=True)
def _avgpool_backward_span(dy, dx, k, s, p, accumulate, t, nparts):
    _, h, w, c = dx.shape
    _, oh_, ow_, _ = dy.shape
    inv = np.float32(1.0 / (k * k))
    lo, hi = partition(dy.shape[0], t, nparts)
    for n in range(lo, hi):
        if not accumulate:
            dx[n] = 0.0
        for oh in range(oh_):
            ilo, ihi = window(oh, k, s, p, h)
            for ow in range(ow_):
                jlo, jhi = window(ow, k, s, p, w)
                g = dy[n, oh, ow]
                for i in range(ilo, ihi):
                    for j in range(jlo, jhi):
                        d = dx[n, oh * s - p + i, ow * s - p + j]
                        for ch in range(c):
                            d[ch] += g[ch] * inv


@njit(cache=True, parallel=True)
def _avgpool_backward_parallel(dy, dx, k, s, p, accumulate, nparts):
    for t in prange(nparts):
        _avgpool_backward_span(dy, dx, k, s, p, accumulate, t, nparts)


# ---------------------------------------------------------------------------- global average pooling

@njit(cache=True)
def _gap_forward_span(x, y, t, nparts):
    n_, h, w, c = x.shape
    inv = 1.0 / (h * w)
    acc = np.empty(c)
    lo, hi = partition(n_, t, nparts)
    for n in range(lo, hi):
        acc[:] = 0.0
        for i in range(h):
            for j in range(w):
                xin = x[n, i, j]
                for ch in range(c):
                    acc[ch] += xin[ch]
        for ch in range(c):
            y[n, ch] = acc[ch] * inv


@njit(cache=True, parallel=True)
def _gap_forward_parallel(x, y, nparts):
    for t in prange(nparts):
        _gap_forward_span(x, y, t, nparts)


@njit(cache=True)
def _gap_backward_span(dy, dx, accumulate, t, nparts):
    n_, h, w, c = dx.shape
    inv = np.float32(1.0 / (h * w))
    lo, hi = partition(n_, t, nparts)
    for n in range(lo, hi):
        g = dy[n]
        for i in range(h):
            for j in range(w):
                d = dx[n, i, j]
                for ch in range(c):
                    d[ch] = g[ch] * inv + (d[ch] if accumulate else np.float32(0.0))


@njit(cache=True, parallel=True)
def _gap_backward_parallel(dy, dx, accumulate, nparts):
    for t in prange(nparts):
        _gap_backward_span(dy, dx, accumulate, t, nparts)


# ---------------------------------------------------------------------------- the contract's entry points

def maxpool_forward(x, y, argmax, k, s, p):
    run_split(_maxpool_forward_span, _maxpool_forward_parallel, y.size * k * k, x, y, argmax, k, s, p)


def maxpool_backward(argmax, dy, dx, accumulate):
    if dx is None:
        return
    run_split(_maxpool_backward_span, _maxpool_backward_parallel, dx.size, argmax, dy, dx, accumulate)


def avgpool_forward(x, y, k, s, p):
    run_split(_avgpool_forward_span, _avgpool_forward_parallel, y.size * k * k, x, y, k, s, p)


def avgpool_backward(dy, dx, k, s, p, accumulate):
    if dx is None:
        return
    run_split(_avgpool_backward_span, _avgpool_backward_parallel, dy.size * k * k, dy, dx, k, s, p, accumulate)


def gap_forward(x, y):
    """``y[n, c] = mean over (h, w) of x[n, h, w, c]``."""
    run_split(_gap_forward_span, _gap_forward_parallel, x.size, x, y)


def gap_backward(dy, dx, accumulate):
    if dx is None:
        return
    run_split(_gap_backward_span, _gap_backward_parallel, dx.size, dy, dx, accumulate)
