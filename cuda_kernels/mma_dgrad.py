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
from ._mma import cp_async_16_from, ld_global_v4, pack_half2, st_global_v4, unpack_half2, warp_uniform
from .mma_conv import MAX_TAPS, bits_between, step_tap_bits, tap_of, tap_step_constants
from .dynamic_smem import SMALLEST_MAX_SHARED
from .mma_tiles import (BK, CHUNK, SMEM_ALIGN, TILES, choose_tile, kc_offset, make_pipeline, mma_kernel, staged_barrier,
                         pipeline_bytes, shared_array_words, stage_layout)
from .registry import H1, flat, nbt

f16, f32, i32, u32 = nbt.float16, nbt.float32, nbt.int32, nbt.uint32
_FAR = -(1 << 24)


@cuda.jit(device=True)
def phase_class(z, extent, s, p, k_):
    """For phase ``z`` of one axis: first input index, count, output offset and tap count."""
    first = i32((z - p) % s)
    count = i32(max(0, (extent - first + s - 1) // s))
    return first, count, i32((first + p - z) // s), i32(max(0, (k_ - z + s - 1) // s))


def make_dgrad(tile):
    T, BM, BN = tile.threads, tile.bm, tile.bn
    A_RPP = T // (BK // CHUNK)
    A_LOADS = math.ceil(BM / A_RPP)
    B_CPR = BN // CHUNK
    # B row r = 8 c + j (k = k0 + r) is staged by the threads whose A chunk column is c (tid & 3): its tap is the
    # A chunk's and its filter channel co + j, so one offset moved with the A tap serves every B row
    JSTEP = T // 4 // B_CPR          # j of a thread's successive B rows
    B_LOADS = math.ceil(CHUNK / JSTEP)
    B_ROW = (BN + CHUNK) * 2
    A_STAGE, B_STAGE, B_BASE = stage_layout(tile, a_trans=False, b_trans=True)
    SMEM_WORDS = shared_array_words(pipeline_bytes(tile, a_trans=False, b_trans=True))   # 0: dynamic
    MI, NI, WTM, WTN, WARPS_M = tile.mi, tile.ni, BM // tile.warps_m, BN // tile.warps_n, tile.warps_m
    ROW_F = BN + CHUNK                  # staged fp32 row (8 words of padding: half-warps' pairs on distinct banks)
    ROUNDS = 1 if BM * ROW_F * 4 <= pipeline_bytes(tile, a_trans=False, b_trans=True) else WARPS_M
    ROUND_ROWS = BM // ROUNDS
    if ROUND_ROWS * ROW_F * 4 > pipeline_bytes(tile, a_trans=False, b_trans=True):
        raise ValueError(f"tile {tile.name}: a warp row of the fp32 output does not fit the pipeline's shared memory")
    CPR = BN // CHUNK                   # 16-byte chunks of an output row
    RPP = T // CPR
    PASSES = math.ceil(ROUND_ROWS / RPP)

    @cuda.jit(device=True)
    def issue(smem, window, dy, w, stage, bx, by, off, b_off, a_base, a_miss, b_add, dst, ty_in):
        """Stage the k-tile of this thread's chunk column at tap bits ``bx = 1 << tx``, ``by = 1 << (16 + ty)``
        (``off`` / ``b_off``: the tap's offsets in dy and w; ``ty_in``: the bits of ``by`` inside the reduction)
        into ``stage``."""
        tid = i32(cuda.threadIdx.x)
        a_dst, b_dst = i32(dst[0] + stage * A_STAGE), i32(dst[1] + B_BASE + stage * B_STAGE)
        # inside this phase class's reduction (k < th_ tw_ c_out): exactly where ty < th_ (tx < tw_, co < c_out), a bit
        # of ty_in while by holds ty's; past the end by may run off its word (0), outside it too. No k in the loop
        k_ok = u32(by & ty_in) != u32(0)
        # past the end of the reduction bit 15, which no row's taps hold (taps <= MAX_TAPS): the copies zero-fill
        q = u32(bx | by) if k_ok else u32(1 << MAX_TAPS)
        for i in range(A_LOADS):
            if A_LOADS * A_RPP == BM or (tid >> 2) + i * A_RPP < BM:   # where a pass overhangs the tile
                cp_async_16_from(smem, window, i32(a_dst + i * A_RPP * BK * 2), dy, a_base[i], off,
                                 u32(q & a_miss[i]) == u32(0))
        for i in range(B_LOADS):   # k0 + 8 c + j < gemm_k where k = k0 + 8 c < gemm_k (both multiples of 8)
            if B_LOADS * JSTEP == CHUNK or (tid >> 2) // B_CPR + i * JSTEP < CHUNK:
                cp_async_16_from(smem, window, i32(b_dst + i * JSTEP * B_ROW), w, b_add[i], b_off, k_ok)

    @cuda.jit(device=True)
    def issue_next(smem, window, stage, operands, state):
        dy, w, a_base, a_miss, b_add, dst, ty_in, tw_, step, deltas, c_out, tw_bit, shifts = operands
        co, bx, by, off, b_off = state
        issue(smem, window, dy, w, stage, bx, by, off, b_off, a_base, a_miss, b_add, dst, ty_in)
        co, bx, by, offs = step_tap_bits(co, bx, by, (off, b_off), step, deltas, c_out, tw_, tw_bit, shifts)
        return co, bx, by, offs[0], offs[1]

    main_loop = make_pipeline(tile, a_trans=False, b_trans=True, issue_next=issue_next, fold_window=True)

    def conv2d_backward_data(dy, w, dx, geo):
        smem = cuda.shared.array(SMEM_WORDS, nbt.float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array((MI, NI, 4), nbt.float32)
        a_base = cuda.local.array(A_LOADS, nbt.int32)
        a_miss = cuda.local.array(A_LOADS, nbt.uint32)
        b_add = cuda.local.array(B_LOADS, nbt.int32)
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
        for i in range(A_LOADS):
            m = m0 + (tid >> 2) + i * A_RPP
            if m < gemm_m:   # the taps (tx, ty) that reach an output pixel: 0 <= a_h - ty < oh, 0 <= a_w - tx < ow
                jw, t = m % wc, m // wc
                jh, b = t % hc, t // hc
                a_h, a_w = jh + dh, jw + dw
                a_base[i] = ((b * oh_ + a_h) * ow_ + a_w) * c_out
                a_miss[i] = ~u32(bits_between(i32(a_w - ow_ + 1), i32(a_w + 1), tw_)
                                 | u32(bits_between(i32(a_h - oh_ + 1), i32(a_h + 1), th_) << u32(16)))
            else:
                a_base[i], a_miss[i] = i32(0), ~u32(0)
        # a block past this class's pixels runs no k-tile and stores nothing (no early return: ptxas would then
        # guard every warp-synchronous instruction with a WARPSYNC)
        tiles = i32((gemm_k + BK - 1) // BK) if m0 < gemm_m else i32(0)
        # (from the phase class's divisions, which ptxas does not see as warp-uniform: without this the main
        # loop's branch costs a WARPSYNC)
        tiles = warp_uniform(tiles)
        k = i32((tid & 3) * CHUNK)
        tw_ = i32(max(tw_, i32(1)))   # a class no tap reaches has no k-tiles: any non-zero divisor
        co, tx, ty = tap_of(k, c_out, tw_)
        step = tap_of(i32(BK), c_out, tw_)
        # dy[.., a_h - ty, a_w - tx, co] = a_base + co - (ty ow + tx) c_out: ``off`` by step, by co wrap, by tx wrap
        deltas = (i32(step[0] - i32(i32(step[1] + i32(step[2] * ow_)) * c_out)), i32(-2 * c_out),
                  i32(i32(tw_ - ow_) * c_out))
        # w[co, ph + s ty, pw + s tx, n] = co CO + ty TY + tx TX + (ph kw_ + pw) c_in + n: linear in the tap
        tap_x, tap_y, tap_c = i32(s * c_in), i32(i32(s * kw_) * c_in), i32(i32(kh_ * kw_) * c_in)
        b_deltas = (i32(i32(step[0] * tap_c) + i32(step[1] * tap_x) + i32(step[2] * tap_y)),
                    i32(tap_x - i32(c_out * tap_c)), i32(tap_y - i32(tw_ * tap_x)))
        # B rows 8 c + j0 + i JSTEP, chunk column cb; columns past N read column N - 8's (never stored)
        j0, cb = i32(i32(tid >> 2) // B_CPR), i32(i32(tid >> 2) % B_CPR)
        n = min(i32(n0 + cb * CHUNK), i32(c_in - CHUNK))
        for i in range(B_LOADS):
            b_add[i] = i32(i32(i32(j0 + i * JSTEP) * tap_c) + n)
        b_off = i32(i32(co * tap_c) + i32(ty * tap_y) + i32(tx * tap_x) + i32(i32(ph * kw_) + pw) * c_in)
        dst = (kc_offset(i32(tid >> 2), i32(tid & 3)), i32(i32(i32((tid & 3) * CHUNK) + j0) * B_ROW + cb * 16))
        off = i32(co - i32(i32(i32(ty * ow_) + tx) * c_out))
        tw_bit, shifts = tap_step_constants(step, tw_)
        ty_in = u32(u32(u32(u32(1) << u32(th_)) - u32(1)) << u32(16))   # bits 16 .. 16 + th_ - 1
        main_loop(smem, tiles, (dy, w, a_base, a_miss, b_add, dst, ty_in, tw_, step, (deltas, b_deltas), c_out,
                                tw_bit, shifts),
                  (co, u32(u32(1) << u32(tx)), u32(u32(1 << 16) << u32(ty)), off, b_off), warp_m, warp_n, acc)
        # the fp32 tile staged in shared memory (``ROUNDS`` row blocks of a warp row each where it does not fit),
        # then 8 channels of one pixel per thread: dx (accumulated in fp32, rounded once) in 16-byte vectors
        c = i32((tid % CPR) * CHUNK)
        for rnd in range(ROUNDS):
            cuda.syncthreads()   # the pipeline's (or the last round's) shared memory is free
            if ROUNDS == 1 or warp_m == rnd:
                for mi in range(MI):
                    for ni in range(NI):
                        for r in range(4):
                            row = warp_m * WTM + mi * 16 + (lane >> 2) + (r >> 1) * 8 - rnd * ROUND_ROWS
                            smem[row * ROW_F + warp_n * WTN + ni * 8 + (lane & 3) * 2 + (r & 1)] = acc[mi, ni, r]
            staged_barrier()
            for pss in range(PASSES):
                row = i32(tid // CPR + pss * RPP)
                m = i32(m0 + rnd * ROUND_ROWS + row)
                if (PASSES * RPP == ROUND_ROWS or row < ROUND_ROWS) and m < gemm_m and n0 + c < gemm_n:
                    jw, t = i32(m % wc), i32(m // wc)
                    jh, b = i32(t % hc), i32(t // hc)
                    o = i32(i32(i32(i32(i32(b * h_) + h0 + s * jh) * w_ + w0 + s * jw) * c_in) + n0 + c)
                    v = cuda.local.array(CHUNK, nbt.float32)
                    for j in range(CHUNK):
                        v[j] = smem[row * ROW_F + c + j]
                    if accumulate:
                        old = ld_global_v4(dx, o)
                        for j in range(CHUNK // 2):
                            lo, hi = unpack_half2(old[j])
                            v[2 * j] += f32(lo)
                            v[2 * j + 1] += f32(hi)
                    st_global_v4(dx, o, pack_half2(f16(v[0]), f16(v[1])), pack_half2(f16(v[2]), f16(v[3])),
                                 pack_half2(f16(v[4]), f16(v[5])), pack_half2(f16(v[6]), f16(v[7])))
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
