"""Tensor-core weight gradient: ``dw[co, k] = sum_pixel dy[pixel, co] * patch(x)[pixel, k]`` (fp32).

GEMM with M = Cout, N = KH*KW*Cin, reduced over output pixels, split over ``blockIdx.z``
(``_conv._reduction_split``) and added into ``dw`` (zeroed first) with fp32 atomics, as the
SIMT kernel does. Both operands are contiguous along M / N (channels), so their tiles are
stored with rows = pixels (padded rows, see ``mma_tiles``) and read with ``ldmatrix.trans``.
Each thread stages a fixed 8-channel chunk column (its filter tap and channel for B are
computed once) and rows whose pixel coordinates advance by ``BK`` pixels per k-tile with
compares and subtractions; ``Cout % 8 == 0``; ``Cin % 8 != 0`` (stems) stages x by scalar loads.
A stem whose input was zero-padded to 8 channels (``padded_stem``) runs the aligned kernel with ``dw`` of
its real channels: the epilogue adds the real columns only (the padded ones are 0 anyway, never stored).
"""
import math

from numba import cuda

from . import _conv
from .elementwise import fill_zero
from .gemm import CONV_GEOMETRY
from ._mma import cp_async_16_at
from .mma_conv import step_tap, store_chunk, tap_of
from .dynamic_smem import SMALLEST_MAX_SHARED
from .mma_tiles import (BK, CHUNK, SMEM_ALIGN, TILES, choose_tile, make_pipeline, mma_kernel, pipeline_bytes,
                         shared_array_words, stage_layout)
from .registry import F1, H1, ZERO, flat, nbt

f16, i32, u32 = nbt.float16, nbt.int32, nbt.uint32
_FAR = -(1 << 24)   # a tap row that no pixel reaches: columns past N


def make_wgrad(tile, any_channels=False):
    """The weight-gradient kernel of ``tile``; ``any_channels``: Cin % 8 != 0 (stems), the x tile
    staged by scalar loads (each column's tap and channel computed once) and ``st.shared.v4``."""
    T, BM, BN = tile.threads, tile.bm, tile.bn
    A_CPR, B_CPR = BM // CHUNK, BN // CHUNK            # 16-byte chunks per smem row
    A_RPP, B_RPP = T // A_CPR, T // B_CPR              # rows one pass of the block stages
    A_LOADS, B_LOADS = math.ceil(BK / A_RPP), math.ceil(BK / B_RPP)
    A_ROW, B_ROW = (BM + CHUNK) * 2, (BN + CHUNK) * 2
    A_STAGE, B_STAGE, B_BASE = stage_layout(tile, a_trans=True, b_trans=True)
    SMEM_WORDS = shared_array_words(pipeline_bytes(tile, a_trans=True, b_trans=True))   # 0: dynamic
    MI, NI, WTM, WTN, WARPS_M = tile.mi, tile.ni, BM // tile.warps_m, BN // tile.warps_n, tile.warps_m

    @cuda.jit(device=True)
    def issue(smem, window, dy, x, stage, p0, p_end, co, co_ok, n_ok, kh, kw, ci, pb, poh, pow_, tkh, tkw, tci, geo):
        h_, w_, c_in, c_out, s, p = geo[4], geo[5], geo[6], geo[9], geo[12], geo[13]
        tid = i32(cuda.threadIdx.x)
        a_stage, b_stage = i32(stage * A_STAGE), i32(B_BASE + stage * B_STAGE)
        v = cuda.local.array(CHUNK, nbt.float16)
        for i in range(A_LOADS):
            r = tid // A_CPR + i * A_RPP
            if A_LOADS * A_RPP == BK or r < BK:
                pix = i32(p0 + r)
                cp_async_16_at(smem, window, i32(a_stage + r * A_ROW + (tid % A_CPR) * 16), dy,
                               i32(i32(pix * c_out) + co), pix < p_end and co_ok)
        for i in range(B_LOADS):
            r = tid // B_CPR + i * B_RPP
            if any_channels and (B_LOADS * B_RPP == BK or r < BK):
                for j in range(CHUNK):
                    hh, ww = poh[i] * s - p + tkh[j], pow_[i] * s - p + tkw[j]
                    valid = p0 + r < p_end and 0 <= hh < h_ and 0 <= ww < w_
                    v[j] = x[((pb[i] * h_ + hh) * w_ + ww) * c_in + tci[j]] if valid else f16(ZERO)
                store_chunk(smem, b_stage + r * B_ROW + (tid % B_CPR) * 16, v)
            elif B_LOADS * B_RPP == BK or r < BK:   # unsigned compares: negative rows are out of range too
                hh, ww = i32(i32(poh[i] * s) + kh), i32(i32(pow_[i] * s) + kw)
                valid = n_ok and i32(p0 + r) < p_end and u32(hh) < u32(h_) and u32(ww) < u32(w_)
                cp_async_16_at(smem, window, i32(b_stage + r * B_ROW + (tid % B_CPR) * 16), x,
                               i32(i32(i32(i32(pb[i] * h_) + hh) * w_ + ww) * c_in) + ci, valid)

    @cuda.jit(device=True)
    def issue_next(smem, window, stage, operands, p0):
        dy, x, p_end, co, co_ok, n_ok, kh, kw, ci, pb, poh, pow_, tkh, tkw, tci, step, geo = operands
        issue(smem, window, dy, x, stage, p0, p_end, co, co_ok, n_ok, kh, kw, ci, pb, poh, pow_, tkh, tkw, tci, geo)
        for i in range(B_LOADS):   # each row's pixel on by BK, without division or loop
            pow_[i], poh[i], pb[i], _ = step_tap(pow_[i], poh[i], pb[i], i32(0), step, (i32(0), i32(0), i32(0)),
                                                 geo[8], geo[7])
        return i32(p0 + BK)

    main_loop = make_pipeline(tile, a_trans=True, b_trans=True, issue_next=issue_next)

    @cuda.jit(device=True)
    def issue_aligned(smem, window, dy, x, stage, p0, a_idx, a_add, a_lim, b_lim, ww, hh, xo, dst, geo):
        """Cin % 8 == 0: each B row's pixel held as its tap's (hh, ww) and x offset ``xo`` (``step_pixels``)."""
        a_dst, b_dst = i32(dst[0] + stage * A_STAGE), i32(dst[1] + B_BASE + stage * B_STAGE)
        for i in range(A_LOADS):   # rows past the split's pixels zero-fill (dy: the product is then 0)
            if A_LOADS * A_RPP == BK or i32(cuda.threadIdx.x) // A_CPR + i * A_RPP < BK:
                cp_async_16_at(smem, window, i32(a_dst + i * A_RPP * A_ROW), dy, i32(a_idx + a_add[i]), p0 < a_lim[i])
        for i in range(B_LOADS):   # unsigned compares: negative rows / columns (padding) are out of range too
            if B_LOADS * B_RPP == BK or i32(cuda.threadIdx.x) // B_CPR + i * B_RPP < BK:
                cp_async_16_at(smem, window, i32(b_dst + i * B_RPP * B_ROW), x, xo[i],
                               p0 < b_lim[i] and u32(hh[i]) < u32(geo[4]) and u32(ww[i]) < u32(geo[5]))

    @cuda.jit(device=True)
    def issue_next_aligned(smem, window, stage, operands, state):
        dy, x, a_add, a_lim, b_lim, ww, hh, xo, dst, ends, deltas, geo = operands
        p0, a_idx = state
        issue_aligned(smem, window, dy, x, stage, p0, a_idx, a_add, a_lim, b_lim, ww, hh, xo, dst, geo)
        for i in range(B_LOADS):   # each row's pixel on by BK: adds and two wrap-arounds (ow into oh, oh into b)
            w2, h2, o2 = i32(ww[i] + deltas[0]), i32(hh[i] + deltas[1]), i32(xo[i] + deltas[2])
            wrap = w2 >= ends[0]
            w2, h2, o2 = (i32(w2 + deltas[3]), i32(h2 + geo[12]), i32(o2 + deltas[4])) if wrap else (w2, h2, o2)
            wrap = h2 >= ends[1]
            ww[i], hh[i], xo[i] = w2, (i32(h2 + deltas[5]) if wrap else h2), (i32(o2 + deltas[6]) if wrap else o2)
        return i32(p0 + BK), i32(a_idx + deltas[7])

    main_loop_aligned = make_pipeline(tile, a_trans=True, b_trans=True, issue_next=issue_next_aligned)

    def conv2d_backward_weight(dy, x, dw, geo):
        smem = cuda.shared.array(SMEM_WORDS, nbt.float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array((MI, NI, 4), nbt.float32)
        pb = cuda.local.array(B_LOADS, nbt.int32)
        poh = cuda.local.array(B_LOADS, nbt.int32)
        pow_ = cuda.local.array(B_LOADS, nbt.int32)
        tkh = cuda.local.array(CHUNK, nbt.int32)   # any_channels: each column's tap and channel
        tkw = cuda.local.array(CHUNK, nbt.int32)
        tci = cuda.local.array(CHUNK, nbt.int32)
        gemm_m, gemm_n, pixels, c_in, oh_, ow_, kw_, chunk = (geo[0], geo[1], geo[2], geo[6], geo[7], geo[8],
                                                              geo[11], geo[15])
        tid = cuda.threadIdx.x
        lane, warp = tid & 31, tid >> 5
        warp_m, warp_n = warp % WARPS_M, warp // WARPS_M
        m0, n0 = i32(cuda.blockIdx.x * BM), i32(cuda.blockIdx.y * BN)
        p0 = i32(cuda.blockIdx.z * chunk)
        p_end = min(pixels, p0 + chunk)
        co = m0 + (tid % A_CPR) * CHUNK
        n = n0 + (tid % B_CPR) * CHUNK          # this thread's B chunk: fixed tap and channel
        n_ok = n < gemm_n
        ci, t = n % c_in, n // c_in
        kw, kh = t % kw_, t // kw_
        if any_channels:
            for j in range(CHUNK):
                tci[j], t = (n + j) % c_in, (n + j) // c_in
                tkw[j], tkh[j] = t % kw_, (t // kw_ if n + j < gemm_n else i32(_FAR))
        tiles = (p_end - p0 + BK - 1) // BK
        if any_channels:
            for i in range(B_LOADS):                # and its pixel rows, advanced by BK per k-tile
                q = p0 + tid // B_CPR + i * B_RPP
                pow_[i], t = q % ow_, q // ow_
                poh[i], pb[i] = t % oh_, t // oh_
            main_loop(smem, tiles, (dy, x, i32(p_end), i32(co), co < gemm_m, n_ok, i32(kh - geo[13]),
                                    i32(kw - geo[13]), i32(ci), pb, poh, pow_, tkh, tkw, tci, tap_of(i32(BK), ow_, oh_),
                                    geo), i32(p0), warp_m, warp_n, acc)
        else:
            h_, w_, c_out, s, p = geo[4], geo[5], geo[9], geo[12], geo[13]
            a_add = cuda.local.array(A_LOADS, nbt.int32)
            a_lim = cuda.local.array(A_LOADS, nbt.int32)
            b_lim = cuda.local.array(B_LOADS, nbt.int32)
            ww = cuda.local.array(B_LOADS, nbt.int32)
            hh = cuda.local.array(B_LOADS, nbt.int32)
            xo = cuda.local.array(B_LOADS, nbt.int32)
            for i in range(A_LOADS):   # dy row r of the k-tile at p0: (p0 + r) c_out + co, while p0 + r < p_end
                r = i32(tid // A_CPR + i * A_RPP)
                a_add[i], a_lim[i] = i32(r * c_out), i32(p_end - r)
            # columns past M / N read column M - 8's / N - 8's tap (never stored): only pixels and padding zero-fill
            co = min(i32(co), i32(c_out - CHUNK))
            n = min(i32(n), i32(gemm_n - CHUNK))
            ci, t = i32(n % c_in), i32(n // c_in)
            kw, kh = i32(t % kw_), i32(t // kw_)
            for i in range(B_LOADS):   # x row r: pixel q = p0 + r = (b, oh, ow) at tap (kh, kw, ci)
                r = i32(tid // B_CPR + i * B_RPP)
                q = i32(p0 + r)
                ow, t = i32(q % ow_), i32(q // ow_)
                oh, b = i32(t % oh_), i32(t // oh_)
                ww[i], hh[i] = i32(i32(ow * s) + kw - p), i32(i32(oh * s) + kh - p)
                xo[i] = i32(i32(i32(i32(b * h_) + hh[i]) * w_ + ww[i]) * c_in) + ci
                b_lim[i] = i32(p_end - r)
            step = tap_of(i32(BK), ow_, oh_)   # BK pixels: (ow, oh, b) steps
            ends = (i32(i32(ow_ * s) + kw - p), i32(i32(oh_ * s) + kh - p))
            row = i32(w_ * c_in)
            deltas = (i32(step[0] * s), i32(step[1] * s),
                      i32(i32(i32(step[2] * h_) * row) + i32(i32(step[1] * s) * row) + i32(i32(step[0] * s) * c_in)),
                      i32(-ow_ * s), i32(i32(s * row) - i32(i32(ow_ * s) * c_in)),
                      i32(-oh_ * s), i32(i32(h_ * row) - i32(i32(oh_ * s) * row)), i32(BK * c_out))
            dst = (i32(i32(tid // A_CPR) * A_ROW + (tid % A_CPR) * 16), i32(i32(tid // B_CPR) * B_ROW + (tid % B_CPR) * 16))
            main_loop_aligned(smem, tiles, (dy, x, a_add, a_lim, b_lim, ww, hh, xo, dst, ends, deltas, geo),
                              (i32(p0), i32(i32(p0 * c_out) + co)), warp_m, warp_n, acc)
        # dw's rows hold KH*KW*channels: fewer than x's where x is a stem's zero-padded input; its padded columns
        # are left out (in the aligned kernel, Cin % 8 == 0, each group of 8 columns lies in one tap)
        dw_row = i32(dw.size // gemm_m)
        channels = i32(dw_row // (geo[10] * kw_))
        group = i32(n0 + warp_n * WTN)            # the first of this thread's ni groups of 8 columns
        first, tap_col = i32(group % c_in), i32(i32(group // c_in) * channels)
        for ni in range(NI):
            for mi in range(MI):
                for r in range(4):
                    row = m0 + warp_m * WTM + mi * 16 + (lane >> 2) + (r >> 1) * 8
                    j = (lane & 3) * 2 + (r & 1)
                    if any_channels:
                        if row < gemm_m and group + j < gemm_n:
                            cuda.atomic.add(dw, row * gemm_n + group + j, acc[mi, ni, r])
                    elif row < gemm_m and group + j < gemm_n and first + j < channels:
                        cuda.atomic.add(dw, row * dw_row + tap_col + first + j, acc[mi, ni, r])
            group = i32(group + 8)
            first = i32(first + 8)
            if first == c_in:   # the next tap
                first, tap_col = i32(0), i32(tap_col + channels)
    return conv2d_backward_weight


# every tile whose pipeline fits every target (above 48 KB as dynamic shared memory: 128x128)
WGRAD_TILES = tuple(t for t in TILES if pipeline_bytes(t, a_trans=True, b_trans=True) <= SMALLEST_MAX_SHARED)
WGRAD = {(tile, any_channels): mma_kernel(
    f"mma_conv2d_backward_weight{'_any_channels' if any_channels else ''}_{tile.name}",
    (H1, H1, F1, CONV_GEOMETRY), pipeline_bytes(tile, a_trans=True, b_trans=True))(make_wgrad(tile, any_channels))
    for tile in WGRAD_TILES for any_channels in (False, True)}


def wgrad_supported(x_shape, w_shape, groups):
    """Groups 1 and ``Cout % 8 == 0`` (dy is staged by cp.async); any Cin."""
    return groups == 1 and w_shape[-1] == x_shape[-1] and w_shape[0] % CHUNK == 0


def wgrad_tile(w_shape):
    """The block tile ``choose_tile`` gives the weight gradient of weights ``w_shape``."""
    c_out, kh, kw, c_in = w_shape
    return choose_tile(c_out, kh * kw * c_in, WGRAD_TILES, min_blocks=1)


def conv2d_backward_weight(launcher, x, w, dy, dw, stride, pad, tile=None):
    """``dw`` (fp32, overwritten) of a convolution ``wgrad_supported`` accepts; ``dw`` may have fewer channels than
    ``w`` and ``x`` where those are a stem's, padded with zeros to a multiple of 8 (its real channels)."""
    c_out, kh, kw, c_in = w.shape
    if dw.size != w.size and not (c_in % CHUNK == 0 and tuple(dw.shape)[:3] == (c_out, kh, kw) and dw.shape[3] < c_in):
        raise ValueError(f"conv2d_backward_weight: dw {tuple(dw.shape)} for w {tuple(w.shape)}: expected w's shape, "
                         f"or fewer channels where w's are a multiple of {CHUNK} (a zero-padded stem)")
    pixels = dy.size // c_out
    gemm_n = kh * kw * c_in
    tile = tile or wgrad_tile(w.shape)
    tiles = math.ceil(c_out / tile.bm) * math.ceil(gemm_n / tile.bn)
    splits, chunk = _conv._reduction_split(pixels, tiles, BK)
    geo = _conv.conv_geometry(x.shape, w.shape, dy.shape, stride, pad, 1, c_out, gemm_n, pixels, chunk)
    fill_zero(launcher, dw)
    launcher.launch(WGRAD[tile, c_in % CHUNK != 0], (math.ceil(c_out / tile.bm), math.ceil(gemm_n / tile.bn), splits), tile.threads,
                    flat(dy), flat(x), flat(dw), geo)
