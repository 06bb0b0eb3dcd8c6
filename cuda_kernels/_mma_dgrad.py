"""Tensor-core input gradient, stride-aware: ``dx = sum_(kh, kw, co) dy[..] * w[co, kh, kw, :]`` (fp16).

No s^2 gather: input pixels split into ``s x s`` phase classes ``((h + pad) % s, (w + pad) % s)``
(``blockIdx.z``). In class (ph, pw) only the taps ``kh = ph + s*ty``, ``kw = pw + s*tx`` reach
an output pixel, at ``oh = jh + dh - ty`` for the class's input rows ``h = h0 + s*jh`` (likewise
for w), so each class is a dense implicit GEMM with M = its pixels, N = Cin and
K = (ty, tx, co): an "im2col" of ``dy`` with negative tap steps. A (dy, channel-contiguous)
is staged swizzled like the forward's; B (filters, Cin-contiguous) on padded rows read with
``ldmatrix.trans``. ``Cin % 8 == Cout % 8 == 0``; a class no tap reaches stores zeros
(or leaves ``dx`` as it was when accumulating).
"""
import math

from numba import cuda

from . import _conv
from ._gemm import CONV_GEOMETRY
from ._mma import cp_async_16
from ._mma_conv import advance_tap
from ._dynamic_smem import SMALLEST_MAX_SHARED
from ._mma_tiles import (BK, CHUNK, SMEM_ALIGN, TILES, choose_tile, kc_offset, make_pipeline, mma_kernel,
                         pipeline_bytes, shared_array_words, stage_layout)
from ._registry import H1, flat, nbt

f16, f32, i32 = nbt.float16, nbt.float32, nbt.int32
_FAR = -(1 << 24)


@cuda.jit(device=True)
def phase_class(z, extent, s, p, k_):
    """For phase ``z`` of one axis: first input index, count, output offset and tap count."""
    first = (z - p) % s
    count = max(0, (extent - first + s - 1) // s)
    return first, count, (first + p - z) // s, max(0, (k_ - z + s - 1) // s)


def make_dgrad(tile):
    T, BM, BN = tile.threads, tile.bm, tile.bn
    A_RPP = T // (BK // CHUNK)
    A_LOADS = math.ceil(BM / A_RPP)
    B_CPR = BN // CHUNK
    B_RPP = T // B_CPR
    B_LOADS = math.ceil(BK / B_RPP)
    B_ROW = (BN + CHUNK) * 2
    A_STAGE, B_STAGE, B_BASE = stage_layout(tile, a_trans=False, b_trans=True)
    SMEM_WORDS = shared_array_words(pipeline_bytes(tile, a_trans=False, b_trans=True))   # 0: dynamic
    MI, NI, WTM, WTN, WARPS_M = tile.mi, tile.ni, BM // tile.warps_m, BN // tile.warps_n, tile.warps_m

    @cuda.jit(device=True)
    def issue(smem, dy, w, stage, k, co, tx, ty, a_base, a_h, a_w, bco, btx, bty, k0, gemm_k, ph, pw, geo):
        c_in, oh_, ow_, c_out, kh_, kw_, s = geo[6], geo[7], geo[8], geo[9], geo[10], geo[11], geo[12]
        tid = cuda.threadIdx.x
        chunk = tid & 3
        tap_offset = (ty * ow_ + tx) * c_out - co
        for i in range(A_LOADS):
            r = (tid >> 2) + i * A_RPP
            if r < BM:
                hh, ww = a_h[i] - ty, a_w[i] - tx
                valid = k < gemm_k and 0 <= hh < oh_ and 0 <= ww < ow_
                cp_async_16(smem, stage * A_STAGE + kc_offset(r, chunk), dy,
                            a_base[i] - tap_offset if valid else i32(0), valid)
        n = cuda.blockIdx.y * BN + (tid % B_CPR) * CHUNK
        for i in range(B_LOADS):
            r = tid // B_CPR + i * B_RPP
            if r < BK:
                valid = k0 + r < gemm_k and n < c_in
                src = (((bco[i] * kh_ + ph + s * bty[i]) * kw_ + pw + s * btx[i]) * c_in + n) if valid else i32(0)
                cp_async_16(smem, B_BASE + stage * B_STAGE + r * B_ROW + (tid % B_CPR) * 16, w, src, valid)

    @cuda.jit(device=True)
    def issue_next(smem, stage, operands, state):
        dy, w, a_base, a_h, a_w, bco, btx, bty, gemm_k, ph, pw, tw_, geo = operands
        k, k0, co, tx, ty = state
        issue(smem, dy, w, stage, k, co, tx, ty, a_base, a_h, a_w, bco, btx, bty, k0, gemm_k, ph, pw, geo)
        co, tx, ty = advance_tap(co, tx, ty, geo[9], tw_)
        for i in range(B_LOADS):
            bco[i], btx[i], bty[i] = advance_tap(bco[i], btx[i], bty[i], geo[9], tw_)
        return i32(k + BK), i32(k0 + BK), i32(co), i32(tx), i32(ty)

    main_loop = make_pipeline(tile, a_trans=False, b_trans=True, issue_next=issue_next)

    def conv2d_backward_data(dy, w, dx, geo):
        smem = cuda.shared.array(SMEM_WORDS, nbt.float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array((MI, NI, 4), nbt.float32)
        a_base = cuda.local.array(A_LOADS, nbt.int32)
        a_h = cuda.local.array(A_LOADS, nbt.int32)
        a_w = cuda.local.array(A_LOADS, nbt.int32)
        bco = cuda.local.array(B_LOADS, nbt.int32)
        btx = cuda.local.array(B_LOADS, nbt.int32)
        bty = cuda.local.array(B_LOADS, nbt.int32)
        batch, h_, w_, c_in, oh_, ow_, c_out = geo[3], geo[4], geo[5], geo[6], geo[7], geo[8], geo[9]
        kh_, kw_, s, p, accumulate = geo[10], geo[11], geo[12], geo[13], geo[16]
        ph, pw = i32(cuda.blockIdx.z // s), i32(cuda.blockIdx.z % s)
        h0, hc, dh, th_ = phase_class(ph, h_, s, p, kh_)
        w0, wc, dw, tw_ = phase_class(pw, w_, s, p, kw_)
        gemm_m, gemm_n, gemm_k = batch * hc * wc, c_in, th_ * tw_ * c_out
        tid = cuda.threadIdx.x
        lane, warp = tid & 31, tid >> 5
        warp_m, warp_n = warp % WARPS_M, warp // WARPS_M
        m0, n0 = i32(cuda.blockIdx.x * BM), i32(cuda.blockIdx.y * BN)
        if m0 >= gemm_m:
            return
        for i in range(A_LOADS):
            m = m0 + (tid >> 2) + i * A_RPP
            if m < gemm_m:
                jw, t = m % wc, m // wc
                jh, b = t % hc, t // hc
                a_h[i], a_w[i] = jh + dh, jw + dw
                a_base[i] = ((b * oh_ + a_h[i]) * ow_ + a_w[i]) * c_out
            else:
                a_h[i], a_w[i], a_base[i] = i32(_FAR), i32(_FAR), i32(0)
        tiles = (gemm_k + BK - 1) // BK
        k = i32((tid & 3) * CHUNK)
        co, tx, ty = k, i32(0), i32(0)
        k0 = i32(0)
        if tiles > 0:
            while co >= c_out:
                co -= c_out
                tx += 1
                if tx == tw_:
                    tx = 0
                    ty += 1
            for i in range(B_LOADS):
                q = tid // B_CPR + i * B_RPP
                bco[i], t = q % c_out, q // c_out
                btx[i], bty[i] = t % tw_, t // tw_
        main_loop(smem, tiles, (dy, w, a_base, a_h, a_w, bco, btx, bty, gemm_k, ph, pw, tw_, geo),
                  (k, k0, i32(co), i32(tx), i32(ty)), warp_m, warp_n, acc)
        pixel = cuda.local.array((MI, 2), nbt.int32)   # the divisions stay out of the unrolled stores
        for mi in range(MI):
            for half in range(2):
                m = m0 + warp_m * WTM + mi * 16 + (lane >> 2) + half * 8
                jw, t = m % wc, m // wc
                jh, b = t % hc, t // hc
                pixel[mi, half] = ((b * h_ + h0 + s * jh) * w_ + w0 + s * jw) * c_in if m < gemm_m else i32(-1)
        if accumulate:   # two loops, each small enough for LLVM to unroll (acc stays in registers)
            for mi in range(MI):
                for ni in range(NI):
                    for r in range(4):
                        n = n0 + warp_n * WTN + ni * 8 + (lane & 3) * 2 + (r & 1)
                        o = pixel[mi, r >> 1]
                        if o >= 0 and n < gemm_n:
                            dx[o + n] = f16(acc[mi, ni, r] + f32(dx[o + n]))
        else:
            for mi in range(MI):
                for ni in range(NI):
                    for r in range(4):
                        n = n0 + warp_n * WTN + ni * 8 + (lane & 3) * 2 + (r & 1)
                        o = pixel[mi, r >> 1]
                        if o >= 0 and n < gemm_n:
                            dx[o + n] = f16(acc[mi, ni, r])
    return conv2d_backward_data


# every tile whose pipeline fits every target (above 48 KB as dynamic shared memory: 128x128)
DGRAD_TILES = tuple(t for t in TILES if pipeline_bytes(t, a_trans=False, b_trans=True) <= SMALLEST_MAX_SHARED)
DGRAD = {tile: mma_kernel(f"mma_conv2d_backward_data_{tile.name}", (H1, H1, H1, CONV_GEOMETRY),
                          pipeline_bytes(tile, a_trans=False, b_trans=True))(make_dgrad(tile))
         for tile in DGRAD_TILES}


def dgrad_tile(w_shape, x_shape, stride):
    """The block tile ``choose_tile`` gives the input gradient of weights ``w_shape`` into ``x_shape``."""
    n, h, w_ = x_shape[:3]
    return choose_tile(n * math.ceil(h / stride) * math.ceil(w_ / stride), w_shape[3], DGRAD_TILES)


def conv2d_backward_data(launcher, w, dy, dx, stride, pad, accumulate, tile=None):
    """``dx`` (fp16) overwritten or accumulated; channels of ``dx`` and ``dy`` multiples of 8, groups 1."""
    c_out, kh, kw, c_in = w.shape
    x_shape = tuple(dx.shape)
    n, h, w_ = x_shape[:3]
    class_pixels = n * math.ceil(h / stride) * math.ceil(w_ / stride)
    tile = tile or dgrad_tile(w.shape, x_shape, stride)
    geo = _conv.conv_geometry(x_shape, w.shape, dy.shape, stride, pad, 1, class_pixels, c_in, 0, 0, accumulate)
    grid = (math.ceil(class_pixels / tile.bm), math.ceil(c_in / tile.bn), stride * stride)
    launcher.launch(DGRAD[tile], grid, tile.threads, flat(dy), flat(w), flat(dx), geo)
