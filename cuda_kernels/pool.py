"""Pooling on NHWC fp16: max / average windows and global average pooling.

One thread per output element in the forward kernels. The backward kernels are
gathers (one thread per input element summing the windows that cover it), so they need
no atomics and accumulate into ``dx`` directly. Window geometry is the tuple
``(N, H, W, C, OH, OW, k, s, p)``.
"""
import numpy as np
from numba import cuda

from .registry import H1, I1, I32, ONE, ZERO, flat, geometry, grid_1d, int32_tuple, kernel, nbt

f16, f32 = nbt.float16, nbt.float32
_NEG_INF = np.float32(-np.inf)
POOL_GEOMETRY = geometry(9)


@cuda.jit(device=True)
def _windows_covering(h, k, s, p, out_size):
    """``[lo, hi)`` of the output positions whose window contains input position ``h``."""
    lo = max(0, -((k - 1 - h - p) // s))
    hi = min(out_size, (h + p) // s + 1)
    return lo, hi


@kernel("maxpool_forward", (H1, H1, I1, POOL_GEOMETRY))
def _maxpool_forward(x, y, argmax, geo):
    n_, h_, w_, c_, oh_, ow_, k, s, p = geo
    for o in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        c = o % c_
        ow = (o // c_) % ow_
        oh = (o // (c_ * ow_)) % oh_
        n = o // (c_ * ow_ * oh_)
        best, best_index = _NEG_INF, 0
        for i in range(k):
            h = oh * s - p + i
            for j in range(k):
                w = ow * s - p + j
                if 0 <= h < h_ and 0 <= w < w_:
                    v = f32(x[((n * h_ + h) * w_ + w) * c_ + c])
                    if v > best:
                        best, best_index = v, (h * w_ + w) * c_ + c
        y[o] = f16(best)
        argmax[o] = best_index


@kernel("maxpool_backward", (I1, H1, H1, POOL_GEOMETRY, I32))
def _maxpool_backward(argmax, dy, dx, geo, accumulate):
    n_, h_, w_, c_, oh_, ow_, k, s, p = geo
    for e in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
        within = e % (h_ * w_ * c_)   # the index argmax stores
        n = e // (h_ * w_ * c_)
        c = e % c_
        w = (e // c_) % w_
        h = within // (w_ * c_)
        g = f32(dx[e]) if accumulate else ZERO
        oh0, oh1 = _windows_covering(h, k, s, p, oh_)
        ow0, ow1 = _windows_covering(w, k, s, p, ow_)
        for oh in range(oh0, oh1):
            for ow in range(ow0, ow1):
                o = ((n * oh_ + oh) * ow_ + ow) * c_ + c
                if argmax[o] == within:
                    g += f32(dy[o])
        dx[e] = f16(g)


@kernel("avgpool_forward", (H1, H1, POOL_GEOMETRY))
def _avgpool_forward(x, y, geo):
    n_, h_, w_, c_, oh_, ow_, k, s, p = geo
    inv_area = ONE / f32(k * k)
    for o in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        c = o % c_
        ow = (o // c_) % ow_
        oh = (o // (c_ * ow_)) % oh_
        n = o // (c_ * ow_ * oh_)
        acc = ZERO
        for i in range(k):
            h = oh * s - p + i
            for j in range(k):
                w = ow * s - p + j
                if 0 <= h < h_ and 0 <= w < w_:
                    acc += f32(x[((n * h_ + h) * w_ + w) * c_ + c])
        y[o] = f16(acc * inv_area)


@kernel("avgpool_backward", (H1, H1, POOL_GEOMETRY, I32))
def _avgpool_backward(dy, dx, geo, accumulate):
    n_, h_, w_, c_, oh_, ow_, k, s, p = geo
    inv_area = ONE / f32(k * k)
    for e in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
        c = e % c_
        w = (e // c_) % w_
        h = (e // (c_ * w_)) % h_
        n = e // (c_ * w_ * h_)
        acc = ZERO
        oh0, oh1 = _windows_covering(h, k, s, p, oh_)
        ow0, ow1 = _windows_covering(w, k, s, p, ow_)
        for oh in range(oh0, oh1):
            for ow in range(ow0, ow1):
                acc += f32(dy[((n * oh_ + oh) * ow_ + ow) * c_ + c])
        g = acc * inv_area
        if accumulate:
            g += f32(dx[e])
        dx[e] = f16(g)


@kernel("gap_forward", (H1, H1, I32, I32))
def _gap_forward(x, y, pixels, channels):
    inv = ONE / f32(pixels)
    for o in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        base = (o // channels) * pixels * channels + o % channels
        acc = ZERO
        for q in range(pixels):
            acc += f32(x[base + q * channels])
        y[o] = f16(acc * inv)


@kernel("gap_backward", (H1, H1, I32, I32, I32))
def _gap_backward(dy, dx, pixels, channels, accumulate):
    inv = ONE / f32(pixels)
    for e in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
        g = f32(dy[(e // (pixels * channels)) * channels + e % channels]) * inv
        if accumulate:
            g += f32(dx[e])
        dx[e] = f16(g)


def _pool_geometry(x_shape, y_shape, k, s, p):
    n, h, w, c = x_shape
    return int32_tuple(n, h, w, c, y_shape[1], y_shape[2], k, s, p)


def maxpool_forward(launcher, x, y, argmax, k, s, p):
    """``-inf`` padding; ``argmax`` (int32) holds ``(h*W + w)*C + c`` within the sample."""
    launcher.launch(_maxpool_forward, *grid_1d(y.size), flat(x), flat(y), flat(argmax),
                    _pool_geometry(x.shape, y.shape, k, s, p))


def maxpool_backward(launcher, argmax, dy, dx, k, s, p, accumulate):
    launcher.launch(_maxpool_backward, *grid_1d(dx.size), flat(argmax), flat(dy), flat(dx),
                    _pool_geometry(dx.shape, dy.shape, k, s, p), np.int32(accumulate))


def avgpool_forward(launcher, x, y, k, s, p):
    """``count_include_pad=True``: the divisor is always ``k*k``."""
    launcher.launch(_avgpool_forward, *grid_1d(y.size), flat(x), flat(y), _pool_geometry(x.shape, y.shape, k, s, p))


def avgpool_backward(launcher, dy, dx, k, s, p, accumulate):
    launcher.launch(_avgpool_backward, *grid_1d(dx.size), flat(dy), flat(dx),
                    _pool_geometry(dx.shape, dy.shape, k, s, p), np.int32(accumulate))


def gap_forward(launcher, x, y):
    """``(N, H, W, C) -> (N, C)`` mean over the pixels."""
    n, h, w, c = x.shape
    launcher.launch(_gap_forward, *grid_1d(y.size), flat(x), flat(y), np.int32(h * w), np.int32(c))


def gap_backward(launcher, dy, dx, accumulate):
    n, h, w, c = dx.shape
    launcher.launch(_gap_backward, *grid_1d(dx.size), flat(dy), flat(dx), np.int32(h * w), np.int32(c),
                    np.int32(accumulate))
