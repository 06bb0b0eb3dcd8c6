"""Depthwise convolution (``groups == Cin == Cout``), NHWC fp16, 8 channels per thread.

Depthwise layers are memory-bound (k*k multiply-adds per loaded element), so they stay SIMT; what
matters is the width of their memory accesses. Where ``C % 8 == 0`` and the activations are
16-byte aligned (every arena view is; the planner pads channels to 8) each thread owns 8
consecutive channels of one pixel and moves them with one 16-byte load or store
(``cuda_kernels.vector``'s ``load8`` / ``store8``; the read-only inputs through ``_mma``'s non-coherent
``ld_global_nc_v4``); the weights (``(C, kh, kw, 1)``: a channel's taps are contiguous, its 8 neighbours
``kh * kw`` apart) are read per element from the cache. Otherwise the one-element kernels of
``_conv`` run. Forward and both gradients side by side:

- forward:         ``y[b, oh, ow, c] = sum_(i, j) x[b, oh*s - p + i, ow*s - p + j, c] * w[c, i, j]``;
- input gradient:  ``dx[b, h, w, c] = sum_(i, j) dy[b, (h + p - i) / s, (w + p - j) / s, c] * w[c, i, j]``
                   over the taps whose quotient is exact and inside ``dy`` (overwritten or accumulated);
- weight gradient: ``dw[c, i, j] = sum_pixel dy[pixel, c] * x[patch(pixel, i, j), c]``, thread
                   (8 channels, tap) over a chunk of pixels (``blockIdx.y``), fp32 atomics.
"""
from numba import cuda

from .gemm import CONV_GEOMETRY
from ._mma import ld_global_nc_v4, unpack_half2
from .registry import F1, H1, ZERO, kernel, nbt
from .vector import VEC8, load8, store8

f32, i32 = nbt.float32, nbt.int32


@cuda.jit(device=True)
def _fma8(acc, r, w, w_index, w_step):
    """``acc[v] += halves(r)[v] * w[w_index + v * w_step]`` for the 8 channels of ``r``."""
    for q in range(VEC8 // 2):
        lo, hi = unpack_half2(r[q])
        acc[2 * q] += f32(lo) * f32(w[w_index + 2 * q * w_step])
        acc[2 * q + 1] += f32(hi) * f32(w[w_index + (2 * q + 1) * w_step])


@kernel("depthwise_forward_vec8", (H1, H1, H1, CONV_GEOMETRY))
def forward_vec8(x, w, y, geo):
    _, _, _, _, h_, w_, c_, oh_, ow_, _, kh_, kw_, s, p, _, _, _ = geo
    c8_, taps = c_ // VEC8, kh_ * kw_
    acc = cuda.local.array(VEC8, nbt.float32)
    for o in range(i32(cuda.grid(1)), i32(y.size // VEC8), i32(cuda.gridsize(1))):
        c8, t = o % c8_, o // c8_
        ow, t = t % ow_, t // ow_
        oh, b = t % oh_, t // oh_
        c = c8 * VEC8
        for v in range(VEC8):
            acc[v] = ZERO
        for i in range(kh_):
            xh = oh * s - p + i
            for j in range(kw_):
                xw = ow * s - p + j
                if 0 <= xh < h_ and 0 <= xw < w_:
                    r = ld_global_nc_v4(x, i32(((b * h_ + xh) * w_ + xw) * c_ + c))
                    _fma8(acc, r, w, (c * kh_ + i) * kw_ + j, taps)
        store8(y, i32(o * VEC8), acc)


@kernel("depthwise_backward_data_vec8", (H1, H1, H1, CONV_GEOMETRY))
def backward_data_vec8(dy, w, dx, geo):
    _, _, _, _, h_, w_, c_, oh_, ow_, _, kh_, kw_, s, p, _, _, accumulate = geo
    c8_, taps = c_ // VEC8, kh_ * kw_
    acc = cuda.local.array(VEC8, nbt.float32)
    for e in range(i32(cuda.grid(1)), i32(dx.size // VEC8), i32(cuda.gridsize(1))):
        c8, t = e % c8_, e // c8_
        x_w, t = t % w_, t // w_
        x_h, b = t % h_, t // h_
        c = c8 * VEC8
        if accumulate:   # dx is written by this thread only, after this read: the coherent load
            load8(acc, dx, e * VEC8)
        else:
            for v in range(VEC8):
                acc[v] = ZERO
        for i in range(kh_):
            ohs = x_h + p - i
            if ohs >= 0 and ohs % s == 0 and ohs // s < oh_:
                for j in range(kw_):
                    ows = x_w + p - j
                    if ows >= 0 and ows % s == 0 and ows // s < ow_:
                        r = ld_global_nc_v4(dy, i32(((b * oh_ + ohs // s) * ow_ + ows // s) * c_ + c))
                        _fma8(acc, r, w, (c * kh_ + i) * kw_ + j, taps)
        store8(dx, i32(e * VEC8), acc)


@kernel("depthwise_backward_weight_vec8", (H1, H1, F1, CONV_GEOMETRY))
def backward_weight_vec8(dy, x, dw, geo):
    """Thread (8 channels, tap) sums its pixel chunk ``blockIdx.y`` and adds into ``dw`` (zeroed first)."""
    _, _, pixels, _, h_, w_, c_, oh_, ow_, _, kh_, kw_, s, p, _, chunk, _ = geo
    c8_ = c_ // VEC8
    acc = cuda.local.array(VEC8, nbt.float32)
    t = cuda.grid(1)
    if t < dw.size // VEC8:
        c8, tap = t % c8_, t // c8_
        i, j = tap // kw_, tap % kw_
        c = c8 * VEC8
        for v in range(VEC8):
            acc[v] = ZERO
        for q in range(cuda.blockIdx.y * chunk, min(pixels, (cuda.blockIdx.y + 1) * chunk)):
            ow, r = q % ow_, q // ow_
            oh, b = r % oh_, r // oh_
            h, w = oh * s - p + i, ow * s - p + j
            if 0 <= h < h_ and 0 <= w < w_:
                rd = ld_global_nc_v4(dy, i32(q * c_ + c))
                rx = ld_global_nc_v4(x, i32(((b * h_ + h) * w_ + w) * c_ + c))
                for u in range(VEC8 // 2):
                    dlo, dhi = unpack_half2(rd[u])
                    xlo, xhi = unpack_half2(rx[u])
                    acc[2 * u] += f32(dlo) * f32(xlo)
                    acc[2 * u + 1] += f32(dhi) * f32(xhi)
        for v in range(VEC8):
            cuda.atomic.add(dw, ((c + v) * kh_ + i) * kw_ + j, acc[v])
