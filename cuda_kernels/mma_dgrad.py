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
from .gemm import CONV_GEOMETRY
from ._mma import cp_async_16_at, shared_window
from .mma_conv import step_tap, tap_of
from .dynamic_smem import SMALLEST_MAX_SHARED
from .mma_tiles import (BK, CHUNK, SMEM_ALIGN, TILES, choose_tile, kc_offset, make_pipeline, mma_kernel,
                         pipeline_bytes, shared_array_words, stage_layout)
from .registry import H1, flat, nbt

f16, f32, i32, u32 = nbt.float16, nbt.float32, nbt.int32, nbt.uint32
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
    def issue(smem, dy, w, stage, k, k0, co, tx, ty, a_base, a_h, a_w, b_src, n_ok, gemm_k, geo):
        oh_, ow_, c_out = geo[7], geo[8], geo[9]
        tid = i32(cuda.threadIdx.x)
        chunk = tid & 3
        window = shared_window(smem)
        a_stage, b_stage = i32(stage * A_STAGE), i32(B_BASE + stage * B_STAGE)
        k_ok = k < gemm_k
        tap_offset = i32(i32(i32(ty * ow_) + tx) * c_out) - co
        for i in range(A_LOADS):
            r = (tid >> 2) + i * A_RPP
            if A_LOADS * A_RPP == BM or r < BM:   # unsigned compares: negative rows are out of range too
                valid = k_ok and u32(i32(a_h[i] - ty)) < u32(oh_) and u32(i32(a_w[i] - tx)) < u32(ow_)
                cp_async_16_at(smem, window, i32(a_stage + kc_offset(r, chunk)), dy, i32(a_base[i] - tap_offset),
                               valid)
        for i in range(B_LOADS):
            r = tid // B_CPR + i * B_RPP
            if B_LOADS * B_RPP == BK or r < BK:
                cp_async_16_at(smem, window, i32(b_stage + r * B_ROW + (tid % B_CPR) * 16), w, b_src[i],
                               n_ok and i32(k0 + r) < gemm_k)

    @cuda.jit(device=True)
    def issue_next(smem, stage, operands, state):
        dy, w, a_base, a_h, a_w, bco, btx, b_src, n_ok, gemm_k, tw_, step, deltas, geo = operands
        k, k0, co, tx, ty = state
        issue(smem, dy, w, stage, k, k0, co, tx, ty, a_base, a_h, a_w, b_src, n_ok, gemm_k, geo)
        co, tx, ty = step_tap(co, tx, ty, step, geo[9], tw_)
        for i in range(B_LOADS):   # each B row's tap and filter offset, advanced without division or loop
            c, t, o = i32(bco[i] + step[0]), i32(btx[i] + step[1]), i32(b_src[i] + deltas[0])
            if c >= geo[9]:
                c, t, o = i32(c - geo[9]), i32(t + 1), i32(o + deltas[1])
            if t >= tw_:
                t, o = i32(t - tw_), i32(o + deltas[2])
            bco[i], btx[i], b_src[i] = c, t, o
        return i32(k + BK), i32(k0 + BK), co, tx, ty

    main_loop = make_pipeline(tile, a_trans=False, b_trans=True, issue_next=issue_next)

    def conv2d_backward_data(dy, w, dx, geo):
        smem = cuda.shared.array(SMEM_WORDS, nbt.float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array((MI, NI, 4), nbt.float32)
        a_base = cuda.local.array(A_LOADS, nbt.int32)
        a_h = cuda.local.array(A_LOADS, nbt.int32)
        a_w = cuda.local.array(A_LOADS, nbt.int32)
        bco = cuda.local.array(B_LOADS, nbt.int32)
        btx = cuda.local.array(B_LOADS, nbt.int32)
        b_src = cuda.local.array(B_LOADS, nbt.int32)
        batch, h_, w_, c_in, oh_, ow_, c_out = geo[3], geo[4], geo[5], geo[6], geo[7], geo[8], geo[9]
        kh_, kw_, s, p, accumulate = geo[10], geo[11], geo[12], geo[13], geo[16]
        ph, pw = i32(cuda.blockIdx.z // s), i32(cuda.blockIdx.z % s)
        h0, hc, dh, th_ = phase_class(ph, h_, s, p, kh_)
        w0, wc, dw, tw_ = phase_class(pw, w_, s, p, kw_)
        gemm_m, gemm_n, gemm_k = i32(batch * hc * wc), c_in, i32(th_ * tw_ * c_out)
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
        tw_ = max(tw_, i32(1))   # a class no tap reaches has no k-tiles: any non-zero divisor
        co, tx, ty = tap_of(k, c_out, tw_)
        step = tap_of(i32(BK), c_out, tw_)
        # w[co, ph + s ty, pw + s tx, n] = co CO + ty TY + tx TX + (ph kw_ + pw) c_in + n: linear in the tap
        tap_x, tap_y, tap_c = i32(s * c_in), i32(i32(s * kw_) * c_in), i32(i32(kh_ * kw_) * c_in)
        deltas = (i32(i32(step[0] * tap_c) + i32(step[1] * tap_x) + i32(step[2] * tap_y)),
                  i32(tap_x - i32(c_out * tap_c)), i32(tap_y - i32(tw_ * tap_x)))
        n = i32(cuda.blockIdx.y * BN + (tid % B_CPR) * CHUNK)
        for i in range(B_LOADS):
            bco[i], btx[i], bty = tap_of(i32(tid // B_CPR + i * B_RPP), c_out, tw_)
            b_src[i] = i32(i32(bco[i] * tap_c) + i32(bty * tap_y) + i32(btx[i] * tap_x) + i32(i32(ph * kw_) + pw) * c_in
                           + n)
        main_loop(smem, tiles, (dy, w, a_base, a_h, a_w, bco, btx, b_src, n < c_in, gemm_k, tw_, step, deltas, geo),
                  (k, i32(0), co, tx, ty), warp_m, warp_n, acc)
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
