"""Pooling on NHWC fp16: max / average windows and global average pooling.

One thread per output element in the forward kernels. The backward kernels are
gathers (one thread per input element summing the windows that cover it), so they need
no atomics and accumulate into ``dx`` directly. Window geometry is the tuple
``(N, H, W, C, OH, OW, k, s, p)``. Where ``C % 8 == 0`` and the arrays are 16-byte aligned the ``_vec8``
kernels give each thread 8 channels of one position (one 16-byte access per tap; ``cuda_kernels.vector``),
the position divided out once per vector.
"""
import numpy as np
from numba import cuda

from .registry import H1, I1, I32, ONE, ZERO, flat, geometry, int32_tuple, kernel, nbt
from .vector import VEC8, grid_vectors, load8, load_i32x8, store8, store_i32x8, vectorisable

f16, f32, i32 = nbt.float16, nbt.float32, nbt.int32
_NEG_INF = np.float32(-np.inf)
POOL_GEOMETRY = geometry(9)


@cuda.jit(device=True)
def _windows_covering(h, k, s, p, out_size):
    """``[lo, hi)`` of the output positions whose window contains input position ``h``."""
    lo = max(0, -((k - 1 - h - p) // s))
    hi = min(out_size, (h + p) // s + 1)
    return lo, hi


@cuda.jit(device=True)
def _element(e, c_, w_, h_):
    """``(n, h, w, c)`` of element ``e`` of an NHWC tensor ``(N, h_, w_, c_)``."""
    c = e % c_   # c, w, h before n: the order the kernels' SASS was measured in (n first costs registers)
    w = (e // c_) % w_
    h = (e // (c_ * w_)) % h_
    return e // (c_ * w_ * h_), h, w, c


@kernel("maxpool_forward", (H1, H1, I1, POOL_GEOMETRY))
def _maxpool_forward(x, y, argmax, geo):
    n_, h_, w_, c_, oh_, ow_, k, s, p = geo
    for o in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        n, oh, ow, c = _element(o, c_, ow_, oh_)
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
        n, oh, ow, c = _element(o, c_, ow_, oh_)
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
        n, h, w, c = _element(e, c_, w_, h_)
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


@cuda.jit(device=True)
def _position(o, c_, w_, h_):
    """``(n, h, w, c)`` of the 8-channel vector ``o`` of an NHWC tensor ``(N, h_, w_, c_)`` (``c``: its first)."""
    c8_ = c_ // VEC8
    t = o // c8_
    return t // (w_ * h_), (t // w_) % h_, t % w_, (o % c8_) * VEC8


@kernel("maxpool_forward_vec8", (H1, H1, I1, POOL_GEOMETRY))
def _maxpool_forward_vec8(x, y, argmax, geo):
    n_, h_, w_, c_, oh_, ow_, k, s, p = geo
    best = cuda.local.array(VEC8, nbt.float32)
    where = cuda.local.array(VEC8, nbt.int32)
    v = cuda.local.array(VEC8, nbt.float32)
    for o in range(i32(cuda.grid(1)), i32(y.size // VEC8), i32(cuda.gridsize(1))):
        n, oh, ow, c = _position(o, c_, ow_, oh_)
        for q in range(VEC8):
            best[q], where[q] = _NEG_INF, 0
        for i in range(k):
            h = oh * s - p + i
            for j in range(k):
                w = ow * s - p + j
                if 0 <= h < h_ and 0 <= w < w_:
                    within = (h * w_ + w) * c_ + c
                    load8(v, x, n * h_ * w_ * c_ + within)
                    for q in range(VEC8):
                        if v[q] > best[q]:
                            best[q], where[q] = v[q], within + q
        store8(y, o * VEC8, best)
        store_i32x8(argmax, o * VEC8, where)


@kernel("maxpool_backward_vec8", (I1, H1, H1, POOL_GEOMETRY, I32))
def _maxpool_backward_vec8(argmax, dy, dx, geo, accumulate):
    n_, h_, w_, c_, oh_, ow_, k, s, p = geo
    g = cuda.local.array(VEC8, nbt.float32)
    d = cuda.local.array(VEC8, nbt.float32)
    a = cuda.local.array(VEC8, nbt.int32)
    for e in range(i32(cuda.grid(1)), i32(dx.size // VEC8), i32(cuda.gridsize(1))):
        n, h, w, c = _position(e, c_, w_, h_)
        within = (h * w_ + w) * c_ + c
        if accumulate:
            load8(g, dx, e * VEC8)
        else:
            for q in range(VEC8):
                g[q] = ZERO
        oh0, oh1 = _windows_covering(h, k, s, p, oh_)
        ow0, ow1 = _windows_covering(w, k, s, p, ow_)
        for oh in range(oh0, oh1):
            for ow in range(ow0, ow1):
                o = ((n * oh_ + oh) * ow_ + ow) * c_ + c
                load_i32x8(a, argmax, o)
                load8(d, dy, o)
                for q in range(VEC8):
                    if a[q] == within + q:
                        g[q] += d[q]
        store8(dx, e * VEC8, g)


@kernel("avgpool_forward_vec8", (H1, H1, POOL_GEOMETRY))
def _avgpool_forward_vec8(x, y, geo):
    n_, h_, w_, c_, oh_, ow_, k, s, p = geo
    inv_area = ONE / f32(k * k)
    acc = cuda.local.array(VEC8, nbt.float32)
    v = cuda.local.array(VEC8, nbt.float32)
    for o in range(i32(cuda.grid(1)), i32(y.size // VEC8), i32(cuda.gridsize(1))):
        n, oh, ow, c = _position(o, c_, ow_, oh_)
        for q in range(VEC8):
            acc[q] = ZERO
        for i in range(k):
            h = oh * s - p + i
            for j in range(k):
                w = ow * s - p + j
                if 0 <= h < h_ and 0 <= w < w_:
                    load8(v, x, ((n * h_ + h) * w_ + w) * c_ + c)
                    for q in range(VEC8):
                        acc[q] += v[q]
        for q in range(VEC8):
            acc[q] *= inv_area
        store8(y, o * VEC8, acc)


@kernel("avgpool_backward_vec8", (H1, H1, POOL_GEOMETRY, I32))
def _avgpool_backward_vec8(dy, dx, geo, accumulate):
    n_, h_, w_, c_, oh_, ow_, k, s, p = geo
    inv_area = ONE / f32(k * k)
    acc = cuda.local.array(VEC8, nbt.float32)
    v = cuda.local.array(VEC8, nbt.float32)
    for e in range(i32(cuda.grid(1)), i32(dx.size // VEC8), i32(cuda.gridsize(1))):
        n, h, w, c = _position(e, c_, w_, h_)
        for q in range(VEC8):
            acc[q] = ZERO
        oh0, oh1 = _windows_covering(h, k, s, p, oh_)
        ow0, ow1 = _windows_covering(w, k, s, p, ow_)
        for oh in range(oh0, oh1):
            for ow in range(ow0, ow1):
                load8(v, dy, ((n * oh_ + oh) * ow_ + ow) * c_ + c)
                for q in range(VEC8):
                    acc[q] += v[q]
        if accumulate:
            load8(v, dx, e * VEC8)
        for q in range(VEC8):
            acc[q] = acc[q] * inv_area + (v[q] if accumulate else ZERO)
        store8(dx, e * VEC8, acc)


@kernel("gap_forward_vec8", (H1, H1, I32, I32))
def _gap_forward_vec8(x, y, pixels, channels):
    inv = ONE / f32(pixels)
    acc = cuda.local.array(VEC8, nbt.float32)
    v = cuda.local.array(VEC8, nbt.float32)
    c8_ = channels // VEC8
    for o in range(i32(cuda.grid(1)), i32(y.size // VEC8), i32(cuda.gridsize(1))):
        base = (o // c8_) * pixels * channels + (o % c8_) * VEC8
        for q in range(VEC8):
            acc[q] = ZERO
        for t in range(pixels):
            load8(v, x, base + t * channels)
            for q in range(VEC8):
                acc[q] += v[q]
        for q in range(VEC8):
            acc[q] *= inv
        store8(y, o * VEC8, acc)


@kernel("gap_backward_vec8", (H1, H1, I32, I32, I32))
def _gap_backward_vec8(dy, dx, pixels, channels, accumulate):
    inv = ONE / f32(pixels)
    g = cuda.local.array(VEC8, nbt.float32)
    v = cuda.local.array(VEC8, nbt.float32)
    c8_ = channels // VEC8
    for e in range(i32(cuda.grid(1)), i32(dx.size // VEC8), i32(cuda.gridsize(1))):
        load8(g, dy, (e // (pixels * c8_)) * channels + (e % c8_) * VEC8)
        if accumulate:
            load8(v, dx, e * VEC8)
        for q in range(VEC8):
            g[q] = g[q] * inv + (v[q] if accumulate else ZERO)
        store8(dx, e * VEC8, g)


def _launch(launcher, scalar, vec8, channels, out, arrays, *args):
    """The ``_vec8`` kernel over ``out``'s 8-channel vectors where it applies, else ``scalar`` over its elements."""
    if vectorisable(channels, VEC8, *arrays):
        launcher.launch(vec8, *grid_vectors(out.size // VEC8), *args)
    else:
        launcher.launch(scalar, *grid_vectors(out.size), *args)


def _pool_geometry(x_shape, y_shape, k, s, p):
    n, h, w, c = x_shape
    return int32_tuple(n, h, w, c, y_shape[1], y_shape[2], k, s, p)


def maxpool_forward(launcher, x, y, argmax, k, s, p):
    """``-inf`` padding; ``argmax`` (int32) holds ``(h*W + w)*C + c`` within the sample."""
    _launch(launcher, _maxpool_forward, _maxpool_forward_vec8, tuple(x.shape)[-1], y, (x, y, argmax), flat(x),
            flat(y), flat(argmax), _pool_geometry(x.shape, y.shape, k, s, p))


def maxpool_backward(launcher, argmax, dy, dx, k, s, p, accumulate):
    _launch(launcher, _maxpool_backward, _maxpool_backward_vec8, tuple(dx.shape)[-1], dx, (argmax, dy, dx),
            flat(argmax), flat(dy), flat(dx), _pool_geometry(dx.shape, dy.shape, k, s, p), np.int32(accumulate))


def avgpool_forward(launcher, x, y, k, s, p):
    """``count_include_pad=True``: the divisor is always ``k*k``."""
    _launch(launcher, _avgpool_forward, _avgpool_forward_vec8, tuple(x.shape)[-1], y, (x, y), flat(x), flat(y),
            _pool_geometry(x.shape, y.shape, k, s, p))


def avgpool_backward(launcher, dy, dx, k, s, p, accumulate):
    _launch(launcher, _avgpool_backward, _avgpool_backward_vec8, tuple(dx.shape)[-1], dx, (dy, dx), flat(dy),
            flat(dx), _pool_geometry(dx.shape, dy.shape, k, s, p), np.int32(accumulate))


def gap_forward(launcher, x, y):
    """``(N, H, W, C) -> (N, C)`` mean over the pixels."""
    n, h, w, c = x.shape
    _launch(launcher, _gap_forward, _gap_forward_vec8, c, y, (x, y), flat(x), flat(y), np.int32(h * w), np.int32(c))


def gap_backward(launcher, dy, dx, accumulate):
    n, h, w, c = dx.shape
    _launch(launcher, _gap_backward, _gap_backward_vec8, c, dx, (dy, dx), flat(dy), flat(dx), np.int32(h * w),
            np.int32(c), np.int32(accumulate))
