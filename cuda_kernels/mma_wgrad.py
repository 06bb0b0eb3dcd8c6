"""Tensor-core weight gradient: ``dw[co, k] = sum_pixel dy[pixel, co] * patch(x)[pixel, k]`` (fp32).

GEMM with M = Cout, N = KH*KW*Cin, reduced over output pixels, split over ``blockIdx.z``
(``_conv._reduction_split``) and added into ``dw`` (zeroed first) with fp32 atomics, as the
SIMT kernel does: by 16-byte reductions (``red.global.add.v4.f32`` on sm_90, four columns per
lane after a lane pair swaps accumulators).
Both operands are contiguous along M / N (channels), so their tiles are
stored with rows = pixels (padded rows, see ``mma_tiles``) and read with ``ldmatrix.trans``.
Each thread stages a fixed 8-channel chunk column (its filter tap and channel for B are
computed once) and rows whose pixel coordinates advance by ``BK`` pixels per k-tile with
compares and subtractions; ``Cin % 8 == 0`` and ``Cout % 8 == 0``.
A convolution whose input was zero-padded to 8k channels (``padded_conv``) runs it with ``dw`` of its real
channels: the epilogue adds the real columns only (the padded ones are 0 anyway, never stored), by scalar atomics.
"""
import math

from numba import cuda

from . import _conv
from .elementwise import fill_zero
from .gemm import CONV_GEOMETRY
from ._mma import cp_async_16_at_plus, cp_async_16_from, red_add_v4, swap_pair
from .dynamic_smem import SMALLEST_MAX_SHARED
from .mma_tiles import (BK, CHUNK, SMEM_ALIGN, TILES, choose_tile, make_pipeline, mma_kernel, pipeline_bytes,
                         shared_array_words, stage_layout)
from .registry import F1, H1, flat, geometry, int32_tuple, nbt

i32, u32 = nbt.int32, nbt.uint32


def make_wgrad(tile):
    """The weight-gradient kernel of ``tile``."""
    T, BM, BN = tile.threads, tile.bm, tile.bn
    A_CPR, B_CPR = BM // CHUNK, BN // CHUNK            # 16-byte chunks per smem row
    A_RPP, B_RPP = T // A_CPR, T // B_CPR              # rows one pass of the block stages
    A_LOADS, B_LOADS = math.ceil(BK / A_RPP), math.ceil(BK / B_RPP)
    A_ROW, B_ROW = (BM + CHUNK) * 2, (BN + CHUNK) * 2
    A_STAGE, B_STAGE, B_BASE = stage_layout(tile, a_trans=True, b_trans=True)
    SMEM_WORDS = shared_array_words(pipeline_bytes(tile, a_trans=True, b_trans=True))   # 0: dynamic
    MI, NI, WTM, WTN, WARPS_M = tile.mi, tile.ni, BM // tile.warps_m, BN // tile.warps_n, tile.warps_m
    # a thread's chunks of one row, A_G / B_G chunk columns apart (every tile: one row each)
    A_G, B_G = A_CPR // A_LOADS, B_CPR // B_LOADS
    if A_G * BK != T or B_G * BK > T or A_CPR % A_LOADS or B_CPR % B_LOADS:
        raise ValueError(f"tile {tile.name}: the weight gradient's rows do not map one per thread")

    def make_issue(first):
        """Each thread stages one row (pixel) of each operand, ``A_LOADS`` / ``B_LOADS`` chunk columns
        ``A_G`` / ``B_G`` chunks apart: dy's at constant offsets from one address, x's at their own taps from the
        row's (hh, ww) and x offset ``xo``, moved on by ``BK`` pixels with adds and two wrap-arounds. The reduction is
        shifted so that its one partial k-tile is split 0's first (``first``: rows before pixel 0 zero-fill); any
        other k-tile is whole or, issued past the end by the pipeline, wholly zero-filled."""
        @cuda.jit(device=True)
        def issue(smem, window, stage, operands, state):
            dy, x, a_first, a_lim, b_kh, b_kw, b_tap, b_ok, dst, steps, p_end, geo = operands
            p0, a_idx, hh, ww, xo = state
            a_dst, b_dst = i32(dst[0] + stage * A_STAGE), i32(dst[1] + B_BASE + stage * B_STAGE)
            ok = p0 < p_end
            for j in range(A_LOADS):   # columns past M (a_lim: never valid) and rows past the pixels zero-fill
                cp_async_16_at_plus(smem, window, i32(a_dst + j * A_G * 16), dy, a_idx, j * A_G * CHUNK,
                                    p0 >= a_first[j] if first else p0 < a_lim[j])
            if B_G * BK == T or i32(cuda.threadIdx.x) < B_G * BK:   # unsigned: negative (padding) is out of range
                for j in range(B_LOADS):
                    cp_async_16_from(smem, window, i32(b_dst + j * B_G * 16), x, b_tap[j], xo,
                                     (p0 >= b_ok[j] if first else ok) & (u32(i32(hh + b_kh[j])) < u32(geo[4]))
                                     & (u32(i32(ww + b_kw[j])) < u32(geo[5])))   # ``&``: no branches
            # the row's pixel on by BK: ow wraps into oh (told by ww before the step, each coordinate then moved by
            # one of two constants), oh into b
            wrap = ww >= steps[9]
            w2, h2, o2 = ((i32(ww + steps[3]), i32(hh + steps[4]), i32(xo + steps[5])) if wrap
                          else (i32(ww + steps[0]), i32(hh + steps[1]), i32(xo + steps[2])))
            wrap = h2 >= steps[10]
            h2, o2 = (i32(h2 + steps[6]), i32(o2 + steps[7])) if wrap else (h2, o2)
            return i32(p0 + BK), i32(a_idx + steps[8]), h2, w2, o2
        return issue

    main_loop = make_pipeline(tile, a_trans=True, b_trans=True, issue_next=make_issue(False),
                              issue_first=make_issue(True))

    def conv2d_backward_weight(dy, x, dw, geo, steps):
        smem = cuda.shared.array(SMEM_WORDS, nbt.float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array((MI, NI, 4), nbt.float32)
        gemm_m, gemm_n, pixels, c_in, oh_, ow_, kw_, chunk = (geo[0], geo[1], geo[2], geo[6], geo[7], geo[8],
                                                              geo[11], geo[15])
        tid = cuda.threadIdx.x
        lane, warp = tid & 31, tid >> 5
        warp_m, warp_n = warp % WARPS_M, warp // WARPS_M
        m0, n0 = i32(cuda.blockIdx.x * BM), i32(cuda.blockIdx.y * BN)
        h_, w_, c_out, s, p = geo[4], geo[5], geo[9], geo[12], geo[13]
        # the reduction shifted back by its pixels' shortfall from whole k-tiles (chunks are whole k-tiles): the
        # one partial k-tile is then split 0's first, rows before pixel 0
        p0 = i32(i32(cuda.blockIdx.z * chunk) - i32(i32(BK - i32(pixels % BK)) % BK))
        p_end = min(pixels, i32(p0 + chunk))
        tiles = i32(i32(p_end - p0) // BK)
        a_first = cuda.local.array(A_LOADS, nbt.int32)
        a_lim = cuda.local.array(A_LOADS, nbt.int32)
        b_kh = cuda.local.array(B_LOADS, nbt.int32)
        b_kw = cuda.local.array(B_LOADS, nbt.int32)
        b_tap = cuda.local.array(B_LOADS, nbt.int32)
        b_ok = cuda.local.array(B_LOADS, nbt.int32)
        r_a = i32(tid // A_G)   # dy row r of the k-tile at p0: (p0 + r) c_out + co_j, a pixel where p0 >= -r
        co = i32(m0 + i32(tid % A_G) * CHUNK)
        for j in range(A_LOADS):   # first k-tile: valid where p0 >= a_first; later ones: where p0 < a_lim
            col_ok = co + j * A_G * CHUNK < c_out
            a_first[j] = i32(-r_a) if col_ok else i32(1 << 30)
            a_lim[j] = p_end if col_ok else i32(-(1 << 30))
        a_idx = i32(i32(i32(p0 + r_a) * c_out) + co)
        r_b = i32(tid // B_G)   # x row r_b: pixel q = p0 + r_b = (b, oh, ow); q < 0: b < 0
        q = i32(p0 + r_b)
        ow, t = i32(q % ow_), i32(q // ow_)
        oh, b = i32(t % oh_), i32(t // oh_)
        hh, ww = i32(i32(oh * s) - p), i32(i32(ow * s) - p)
        xo = i32(i32(i32(i32(b * h_) + hh) * w_ + ww) * c_in)
        for j in range(B_LOADS):   # column j's tap; columns past N read column N - 8's (never stored)
            n = min(i32(i32(n0 + i32(tid % B_G) * CHUNK) + j * B_G * CHUNK), i32(gemm_n - CHUNK))
            ci, t = i32(n % c_in), i32(n // c_in)
            b_kw[j], b_kh[j] = i32(t % kw_), i32(t // kw_)
            b_tap[j] = i32(i32(i32(b_kh[j] * w_) + b_kw[j]) * c_in) + ci
            b_ok[j] = i32(-r_b)
        dst = (i32(r_a * A_ROW + (tid % A_G) * 16), i32(r_b * B_ROW + (tid % B_G) * 16))
        main_loop(smem, tiles, (dy, x, a_first, a_lim, b_kh, b_kw, b_tap, b_ok, dst, steps, p_end, geo),
                  (i32(p0), a_idx, hh, ww, xo), warp_m, warp_n, acc)
        dw_row = i32(dw.size // gemm_m)   # gemm_n, or fewer where x is zero-padded (``padded_conv``)
        if dw_row != gemm_n:
            # a zero-padded input: dw's rows hold KH*KW*channels, fewer than x's, and its padded columns are left
            # out (Cin % 8 == 0: each group of 8 columns lies in one tap)
            channels = i32(dw_row // (geo[10] * kw_))
            group = i32(n0 + warp_n * WTN)            # the first of this thread's ni groups of 8 columns
            first, tap_col = i32(group % c_in), i32(i32(group // c_in) * channels)
            for ni in range(NI):
                for mi in range(MI):
                    for r in range(4):
                        row = m0 + warp_m * WTM + mi * 16 + (lane >> 2) + (r >> 1) * 8
                        j = (lane & 3) * 2 + (r & 1)
                        if row < gemm_m and group + j < gemm_n and first + j < channels:
                            cuda.atomic.add(dw, row * dw_row + tap_col + first + j, acc[mi, ni, r])
                group = i32(group + 8)
                first = i32(first + 8)
                if first == c_in:   # the next tap
                    first, tap_col = i32(0), i32(tap_col + channels)
        else:   # 16-byte reductions (gemm_n % 8 == 0: every row 16-byte aligned, a quad wholly in or out of it).
            # Lane 4g + t holds columns 2t, 2t + 1 of rows g and g + 8; the lane pair t, t ^ 1 swaps halves so that
            # the even lane adds row g's four columns from 2 (t & 2), the odd lane row g + 8's. red_add_v4 is called
            # here, in the kernel: it reads the target's compute capability (sm_80: four scalar reductions) while
            # the kernel is lowered, and device functions are compiled once, for the current device
            odd = (lane & 1) == 1
            row = i32(i32(m0 + warp_m * WTM + (lane >> 2)) + (8 if odd else 0))
            col = i32(n0 + warp_n * WTN + (lane & 2) * 2)
            for mi in range(MI):
                for ni in range(NI):
                    c0, c1, c2, c3 = acc[mi, ni, 0], acc[mi, ni, 1], acc[mi, ni, 2], acc[mi, ni, 3]
                    w0, w1 = swap_pair(c0 if odd else c2, c1 if odd else c3)   # every lane: before the bounds check
                    r, c = i32(row + mi * 16), i32(col + ni * 8)
                    if r < gemm_m and c < gemm_n:   # selects, not branches: one reduction in the code per quad
                        red_add_v4(dw, i32(i32(r * gemm_n) + c), w0 if odd else c0, w1 if odd else c1,
                                   c2 if odd else w0, c3 if odd else w1)
    return conv2d_backward_weight


WGRAD_STEPS = geometry(11)


def pixel_steps(x_shape, dy_shape, stride, pad):
    """The aligned kernel's constants for moving a B row's pixel on by ``BK`` (int32, computed here so that the
    main loop reads them as parameters instead of recomputing products): ``ww, hh, xo`` by the step, by the step
    where ``ow`` wraps into ``oh`` (step and wrap summed: one add each either way), ``hh, xo`` by the ``oh``
    wrap, dy's index by ``BK`` pixels, the ``ww`` from which the step wraps ``ow`` (compared before the step, so
    that the step's adds need not wait for it) and the ``hh`` after the step at which ``oh`` wraps."""
    _, h, w, c_in = x_shape
    _, oh, ow, c_out = dy_shape
    s, row = stride, w * c_in
    s0, t = BK % ow, BK // ow
    s1, s2 = t % oh, t // oh
    step = (s0 * s, s1 * s, s2 * h * row + s1 * s * row + s0 * s * c_in)
    wrap = (-ow * s, s, s * row - ow * s * c_in)
    return int32_tuple(*step, *(a + b for a, b in zip(step, wrap)), -oh * s, h * row - oh * s * row, BK * c_out,
                       ow * s - pad - step[0], oh * s - pad)


# every tile whose pipeline fits every target (above 48 KB as dynamic shared memory: 128x128)
WGRAD_TILES = tuple(t for t in TILES if pipeline_bytes(t, a_trans=True, b_trans=True) <= SMALLEST_MAX_SHARED)
WGRAD = {tile: mma_kernel(f"mma_conv2d_backward_weight_{tile.name}", (H1, H1, F1, CONV_GEOMETRY, WGRAD_STEPS),
                          pipeline_bytes(tile, a_trans=True, b_trans=True))(make_wgrad(tile)) for tile in WGRAD_TILES}


def wgrad_supported(x_shape, w_shape, groups):
    """Groups 1, ``Cin % 8 == 0`` and ``Cout % 8 == 0`` (x and dy are staged by cp.async)."""
    return groups == 1 and w_shape[-1] == x_shape[-1] and w_shape[-1] % CHUNK == 0 and w_shape[0] % CHUNK == 0


def wgrad_tile(w_shape):
    """The block tile ``choose_tile`` gives the weight gradient of weights ``w_shape``."""
    c_out, kh, kw, c_in = w_shape
    return choose_tile(c_out, kh * kw * c_in, WGRAD_TILES, min_blocks=1)


def conv2d_backward_weight(launcher, x, w, dy, dw, stride, pad, tile=None):
    """``dw`` (fp32, overwritten) of a convolution ``wgrad_supported`` accepts; ``dw`` may have fewer channels than
    ``w`` and ``x`` where those are zero-padded to a multiple of 8 (its real channels, ``padded_conv``)."""
    c_out, kh, kw, c_in = w.shape
    if dw.size != w.size and not (c_in % CHUNK == 0 and tuple(dw.shape)[:3] == (c_out, kh, kw) and dw.shape[3] < c_in):
        raise ValueError(f"conv2d_backward_weight: dw {tuple(dw.shape)} for w {tuple(w.shape)}: expected w's shape, "
                         f"or fewer channels where w's are a multiple of {CHUNK} (a zero-padded convolution)")
    pixels = dy.size // c_out
    gemm_n = kh * kw * c_in
    tile = tile or wgrad_tile(w.shape)
    tiles = math.ceil(c_out / tile.bm) * math.ceil(gemm_n / tile.bn)
    splits, chunk = _conv._reduction_split(pixels, tiles, BK)
    geo = _conv.conv_geometry(x.shape, w.shape, dy.shape, stride, pad, 1, c_out, gemm_n, pixels, chunk)
    fill_zero(launcher, dw)
    launcher.launch(WGRAD[tile], (math.ceil(c_out / tile.bm), math.ceil(gemm_n / tile.bn), splits), tile.threads,
                    flat(dy), flat(x), flat(dw), geo, pixel_steps(x.shape, dy.shape, stride, pad))
