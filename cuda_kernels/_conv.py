"""2-D convolution on NHWC fp16 as implicit GEMM (weights OHWI), plus a direct depthwise path.

With ``M = N*OH*OW`` output pixels, ``K = KH*KW*Cin_g`` and group ``g``:
- forward:         ``y[pixel, g*Cout_g + n] = sum_k patch(x)[pixel, k] * w[g*Cout_g + n, k]``;
- backward data:   ``dx[pixel_in, g*Cin_g + n] = sum_(kh, kw, co) dy[...] * w[co, kh, kw, n]``
                   (each input pixel gathers the output pixels whose window holds it);
- backward weight: ``dw[g*Cout_g + m, k] = sum_pixel dy[pixel, g*Cout_g + m] * patch(x)[pixel, k]``,
                   with the pixel reduction split over ``blockIdx.z`` and fp32 atomics.
The forward may accumulate per-channel sum / sum of squares of the stored fp16 output for
the BatchNorm that follows (``bn_sums``): docs/internals/cuda-path.md, "Fusion in training". No im2col buffer.
Depthwise (``groups == Cin == Cout``) runs direct kernels: 8 channels per thread with 16-byte
vectors where ``C % 8 == 0`` (``_depthwise``), else one thread per element.
"""
import math

from numba import cuda

from . import _depthwise
from .batchnorm import batchnorm_stats
from .elementwise import fill_zero
from .gemm import BLOCK, CONV_GEOMETRY, gemm_grid, make_geometry, make_mainloop
from .registry import F1, H1, SIMULATOR, ZERO, flat, grid_1d, kernel, nbt
from .vector import VEC8, vectorisable
from ._tile import BK, BM, BN, THREADS_PER_BLOCK, TM, TN, tile_col, tile_row

f16, f32 = nbt.float16, nbt.float32
_SPLIT_TARGET_BLOCKS = 2 if SIMULATOR else 264   # two blocks per SM of an H200
DEPTHWISE_WEIGHT_THREADS = 128


@cuda.jit(device=True)
def _x_patch(x, geo, g, pixel, patch):
    """``patch(x)[pixel, patch]``: pixel = (b, oh, ow), patch = (kh, kw, ci); 0 in the padding."""
    _, _, _, _, h_, w_, c_in, oh_, ow_, _, _, kw_, s, p, groups, _, _ = geo
    cin_g = c_in // groups
    ci, t = patch % cin_g, patch // cin_g
    kw, kh = t % kw_, t // kw_
    ow, t = pixel % ow_, pixel // ow_
    oh, b = t % oh_, t // oh_
    h, w = oh * s - p + kh, ow * s - p + kw
    if 0 <= h < h_ and 0 <= w < w_:
        return x[((b * h_ + h) * w_ + w) * c_in + g * cin_g + ci]
    return f16(ZERO)


@cuda.jit(device=True)
def _load_x_patch(x, geo, g, m, k):
    return _x_patch(x, geo, g, m, k)


@cuda.jit(device=True)
def _load_w_row(w, geo, g, k, n):
    cout_g = geo[9] // geo[14]
    return w[(g * cout_g + n) * geo[2] + k]


@cuda.jit(device=True)
def _load_dy_gather(dy, geo, g, m, k):
    """dy at the output pixel that sees input pixel m = (b, h, w) through tap k = (kh, kw, co)."""
    _, _, _, _, h_, w_, _, oh_, ow_, c_out, _, kw_, s, p, groups, _, _ = geo
    cout_g = c_out // groups
    co, t = k % cout_g, k // cout_g
    kw, kh = t % kw_, t // kw_
    w, t = m % w_, m // w_
    h, b = t % h_, t // h_
    ohs, ows = h + p - kh, w + p - kw
    if ohs >= 0 and ows >= 0 and ohs % s == 0 and ows % s == 0:
        oh, ow = ohs // s, ows // s
        if oh < oh_ and ow < ow_:
            return dy[((b * oh_ + oh) * ow_ + ow) * c_out + g * cout_g + co]
    return f16(ZERO)


@cuda.jit(device=True)
def _load_w_tap(w, geo, g, k, n):
    _, _, _, _, _, _, c_in, _, _, c_out, kh_, kw_, _, _, groups, _, _ = geo
    cout_g, cin_g = c_out // groups, c_in // groups
    co, t = k % cout_g, k // cout_g
    kw, kh = t % kw_, t // kw_
    return w[(((g * cout_g + co) * kh_ + kh) * kw_ + kw) * cin_g + n]


@cuda.jit(device=True)
def _load_dy_column(dy, geo, g, m, k):
    cout_g = geo[9] // geo[14]
    return dy[k * geo[9] + g * cout_g + m]


@cuda.jit(device=True)
def _load_x_for_dw(x, geo, g, k, n):
    return _x_patch(x, geo, g, k, n)


forward_mainloop = make_mainloop(_load_x_patch, _load_w_row, a_k_fastest=True, b_k_fastest=True)
_backward_data_mainloop = make_mainloop(_load_dy_gather, _load_w_tap, a_k_fastest=True, b_k_fastest=False)
_backward_weight_mainloop = make_mainloop(_load_dy_column, _load_x_for_dw, a_k_fastest=False, b_k_fastest=False)


@kernel("conv2d_forward", (H1, H1, H1, CONV_GEOMETRY))
def _conv2d_forward(x, w, y, geo):
    acc = cuda.local.array((TM, TN), nbt.float32)
    g, m0, n0 = cuda.blockIdx.z, cuda.blockIdx.x * BM, cuda.blockIdx.y * BN
    forward_mainloop(x, w, geo, g, m0, n0, 0, geo[2], acc)
    for i in range(TM):
        m = m0 + tile_row(i)
        for j in range(TN):
            n = n0 + tile_col(j)
            if m < geo[0] and n < geo[1]:
                y[m * geo[9] + g * geo[1] + n] = f16(acc[i, j])


@kernel("conv2d_forward_bn_stats", (H1, H1, H1, F1, F1, CONV_GEOMETRY))
def _conv2d_forward_bn_stats(x, w, y, sums, sumsq, geo):
    col_sum = cuda.shared.array(BN, nbt.float32)
    col_sumsq = cuda.shared.array(BN, nbt.float32)
    acc = cuda.local.array((TM, TN), nbt.float32)
    g, m0, n0 = cuda.blockIdx.z, cuda.blockIdx.x * BM, cuda.blockIdx.y * BN
    tid = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    for c in range(tid, BN, THREADS_PER_BLOCK):
        col_sum[c] = ZERO
        col_sumsq[c] = ZERO
    cuda.syncthreads()
    forward_mainloop(x, w, geo, g, m0, n0, 0, geo[2], acc)
    for j in range(TN):
        n = n0 + tile_col(j)
        part, part_sq = ZERO, ZERO
        for i in range(TM):
            m = m0 + tile_row(i)
            if m < geo[0] and n < geo[1]:
                v = f16(acc[i, j])
                y[m * geo[9] + g * geo[1] + n] = v
                part += f32(v)
                part_sq += f32(v) * f32(v)
        cuda.atomic.add(col_sum, tile_col(j), part)
        cuda.atomic.add(col_sumsq, tile_col(j), part_sq)
    cuda.syncthreads()
    for c in range(tid, min(BN, geo[1] - n0), THREADS_PER_BLOCK):
        cuda.atomic.add(sums, g * geo[1] + n0 + c, col_sum[c])
        cuda.atomic.add(sumsq, g * geo[1] + n0 + c, col_sumsq[c])


@kernel("conv2d_backward_data", (H1, H1, H1, CONV_GEOMETRY))
def _conv2d_backward_data(dy, w, dx, geo):
    acc = cuda.local.array((TM, TN), nbt.float32)
    g, m0, n0 = cuda.blockIdx.z, cuda.blockIdx.x * BM, cuda.blockIdx.y * BN
    _backward_data_mainloop(dy, w, geo, g, m0, n0, 0, geo[2], acc)
    for i in range(TM):
        m = m0 + tile_row(i)
        for j in range(TN):
            n = n0 + tile_col(j)
            if m < geo[0] and n < geo[1]:
                o = m * geo[6] + g * geo[1] + n
                v = acc[i, j]
                if geo[16]:
                    v += f32(dx[o])
                dx[o] = f16(v)


@kernel("conv2d_backward_weight", (H1, H1, F1, CONV_GEOMETRY))
def _conv2d_backward_weight(dy, x, dw, geo):
    """Adds this block's share of the pixel reduction into ``dw`` (zeroed by the launcher)."""
    acc = cuda.local.array((TM, TN), nbt.float32)
    g, split = cuda.blockIdx.z % geo[14], cuda.blockIdx.z // geo[14]
    m0, n0 = cuda.blockIdx.x * BM, cuda.blockIdx.y * BN
    k_begin = split * geo[15]
    _backward_weight_mainloop(dy, x, geo, g, m0, n0, k_begin, min(geo[2], k_begin + geo[15]), acc)
    for i in range(TM):
        m = m0 + tile_row(i)
        for j in range(TN):
            n = n0 + tile_col(j)
            if m < geo[0] and n < geo[1]:
                cuda.atomic.add(dw, (g * geo[0] + m) * geo[1] + n, acc[i, j])


@kernel("depthwise_forward", (H1, H1, H1, CONV_GEOMETRY))
def _depthwise_forward(x, w, y, geo):
    _, _, _, _, h_, w_, c_, oh_, ow_, _, kh_, kw_, s, p, _, _, _ = geo
    for o in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        c, t = o % c_, o // c_
        ow, t = t % ow_, t // ow_
        oh, b = t % oh_, t // oh_
        acc = ZERO
        for i in range(kh_):
            xh = oh * s - p + i
            for j in range(kw_):
                xw = ow * s - p + j
                if 0 <= xh < h_ and 0 <= xw < w_:
                    acc += f32(x[((b * h_ + xh) * w_ + xw) * c_ + c]) * f32(w[(c * kh_ + i) * kw_ + j])
        y[o] = f16(acc)


@kernel("depthwise_backward_data", (H1, H1, H1, CONV_GEOMETRY))
def _depthwise_backward_data(dy, w, dx, geo):
    _, _, _, _, h_, w_, c_, oh_, ow_, _, kh_, kw_, s, p, _, _, accumulate = geo
    for e in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
        c, t = e % c_, e // c_
        x_w, t = t % w_, t // w_
        x_h, b = t % h_, t // h_
        acc = f32(dx[e]) if accumulate else ZERO
        for i in range(kh_):
            ohs = x_h + p - i
            if ohs >= 0 and ohs % s == 0 and ohs // s < oh_:
                for j in range(kw_):
                    ows = x_w + p - j
                    if ows >= 0 and ows % s == 0 and ows // s < ow_:
                        o = ((b * oh_ + ohs // s) * ow_ + ows // s) * c_ + c
                        acc += f32(dy[o]) * f32(w[(c * kh_ + i) * kw_ + j])
        dx[e] = f16(acc)


@kernel("depthwise_backward_weight", (H1, H1, F1, CONV_GEOMETRY))
def _depthwise_backward_weight(dy, x, dw, geo):
    """Thread (c, tap) sums its pixel chunk ``blockIdx.y`` and adds it into ``dw`` (zeroed first)."""
    _, _, pixels, _, h_, w_, c_, oh_, ow_, _, kh_, kw_, s, p, _, chunk, _ = geo
    t = cuda.grid(1)
    if t < dw.size:
        c, tap = t % c_, t // c_
        i, j = tap // kw_, tap % kw_
        acc = ZERO
        for q in range(cuda.blockIdx.y * chunk, min(pixels, (cuda.blockIdx.y + 1) * chunk)):
            ow, r = q % ow_, q // ow_
            oh, b = r % oh_, r // oh_
            h, w = oh * s - p + i, ow * s - p + j
            if 0 <= h < h_ and 0 <= w < w_:
                acc += f32(dy[q * c_ + c]) * f32(x[((b * h_ + h) * w_ + w) * c_ + c])
        cuda.atomic.add(dw, (c * kh_ + i) * kw_ + j, acc)


def conv_geometry(x_shape, w_shape, y_shape, stride, pad, groups, gemm_m, gemm_n, gemm_k, k_chunk=0, accumulate=False):
    n, h, w, c_in = x_shape
    c_out, kh, kw, cin_g = w_shape
    expected = (n, (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1, c_out)
    if tuple(y_shape) != expected or cin_g * groups != c_in or c_out % groups:
        raise ValueError(f"conv2d: x {tuple(x_shape)}, w {tuple(w_shape)}, stride {stride}, pad {pad}, "
                         f"groups {groups} give y {expected}; got y {tuple(y_shape)}")
    return make_geometry(gemm_m=gemm_m, gemm_n=gemm_n, gemm_k=gemm_k, batch=n, h=h, w=w, c_in=c_in,
                         oh=expected[1], ow=expected[2], c_out=c_out, kh=kh, kw=kw, stride=stride, pad=pad,
                         groups=groups, k_chunk=k_chunk, accumulate=int(accumulate))


def _is_depthwise(x_shape, w_shape, groups):
    return groups > 1 and groups == x_shape[-1] == w_shape[0] and w_shape[-1] == 1


def _reduction_split(total, tiles, granule):
    """``(splits, chunk)``: cut a reduction of ``total`` into chunks (multiples of ``granule``)."""
    splits = max(1, min(math.ceil(_SPLIT_TARGET_BLOCKS / tiles), math.ceil(total / (8 * granule))))
    chunk = math.ceil(math.ceil(total / splits) / granule) * granule
    return math.ceil(total / chunk), chunk


def conv2d_forward(launcher, x, w, y, stride, pad, groups, bn_sums=None):
    """``y = conv(x, w)``; with ``bn_sums = (sums, sumsq)`` also their per-channel sums (zeroed first)."""
    c_out, kh, kw, cin_g = w.shape
    pixels = y.size // c_out
    if _is_depthwise(tuple(x.shape), tuple(w.shape), groups):
        geo = conv_geometry(x.shape, w.shape, y.shape, stride, pad, groups, pixels, c_out, kh * kw)
        if vectorisable(c_out, VEC8, x, y):
            launcher.launch(_depthwise.forward_vec8, *grid_1d(y.size // VEC8), flat(x), flat(w), flat(y),
                            geo)
        else:
            launcher.launch(_depthwise_forward, *grid_1d(y.size), flat(x), flat(w), flat(y), geo)
        if bn_sums is not None:
            batchnorm_stats(launcher, y, *bn_sums)
        return
    geo = conv_geometry(x.shape, w.shape, y.shape, stride, pad, groups, pixels, c_out // groups, kh * kw * cin_g)
    grid = gemm_grid(pixels, c_out // groups, groups)
    if bn_sums is None:
        launcher.launch(_conv2d_forward, grid, BLOCK, flat(x), flat(w), flat(y), geo)
    else:
        fill_zero(launcher, bn_sums[0])
        fill_zero(launcher, bn_sums[1])
        launcher.launch(_conv2d_forward_bn_stats, grid, BLOCK, flat(x), flat(w), flat(y), *bn_sums, geo)


def conv2d_backward(launcher, x, w, dy, dx, dw, stride, pad, groups, accumulate):
    """``dw`` (fp32) is overwritten; ``dx`` (fp16, or None) overwritten or accumulated."""
    c_out, kh, kw, cin_g = w.shape
    pixels_out = dy.size // c_out
    fill_zero(launcher, dw)
    if _is_depthwise(tuple(x.shape), tuple(w.shape), groups):
        vec = VEC8 if vectorisable(c_out, VEC8, x, dy) else 1
        blocks = math.ceil(dw.size / vec / DEPTHWISE_WEIGHT_THREADS)
        splits, chunk = _reduction_split(pixels_out, blocks, 64)
        geo = conv_geometry(x.shape, w.shape, dy.shape, stride, pad, groups, c_out, kh * kw, pixels_out, chunk)
        launcher.launch(_depthwise.backward_weight_vec8 if vec > 1 else _depthwise_backward_weight, (blocks, splits),
                        DEPTHWISE_WEIGHT_THREADS, flat(dy), flat(x), flat(dw), geo)
        if dx is not None:
            geo = conv_geometry(x.shape, w.shape, dy.shape, stride, pad, groups, c_out, kh * kw, pixels_out, 0,
                                accumulate)
            if vectorisable(c_out, VEC8, dy, dx):
                launcher.launch(_depthwise.backward_data_vec8, *grid_1d(dx.size // VEC8), flat(dy),
                                flat(w), flat(dx), geo)
            else:
                launcher.launch(_depthwise_backward_data, *grid_1d(dx.size), flat(dy), flat(w), flat(dx), geo)
        return
    cout_g = c_out // groups
    tiles = gemm_grid(cout_g, kh * kw * cin_g, groups)
    splits, chunk = _reduction_split(pixels_out, tiles[0] * tiles[1] * tiles[2], BK)
    geo = conv_geometry(x.shape, w.shape, dy.shape, stride, pad, groups, cout_g, kh * kw * cin_g, pixels_out, chunk)
    launcher.launch(_conv2d_backward_weight, gemm_grid(cout_g, kh * kw * cin_g, groups, splits), BLOCK,
                    flat(dy), flat(x), flat(dw), geo)
    if dx is not None:
        pixels_in = dx.size // tuple(dx.shape)[-1]
        geo = conv_geometry(x.shape, w.shape, dy.shape, stride, pad, groups, pixels_in, cin_g, kh * kw * cout_g,
                            0, accumulate)
        launcher.launch(_conv2d_backward_data, gemm_grid(pixels_in, cin_g, groups), BLOCK,
                        flat(dy), flat(w), flat(dx), geo)
