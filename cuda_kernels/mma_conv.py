"""Tensor-core implicit-GEMM convolution forward (NHWC fp16, weights OHWI, fp32 accumulation).

``y[pixel, n] = sum_k patch(x)[pixel, k] * w[n, k]`` with ``k = (kh, kw, ci)``, ``groups == 1``
and ``Cin % 8 == 0`` (under AMP the planner pads a convolution's channels to 8k, ``padded_conv``): a 16-byte chunk of ``k`` is 8 channels of
one tap, one ``cp.async`` (zero-filled in the padding). Each thread stages fixed rows of the
A tile (output pixels) and of the B tile (filters): their pixel origins are computed once
per block, and the tap / channel of its chunk column advances by ``BK`` per k-tile with
compares and subtractions (no division in the main loop). The ``STAGES``-deep pipeline is
``mma_tiles.make_pipeline``'s.

The epilogue stores fp16 and either adds, for the BatchNorm that follows, per-channel sums
and sums of squares of the stored values (the SIMT kernel's fusion), reduced in a fixed
order in shared memory (the pipeline's, reused; no shared atomics, so a block's sums do
not depend on thread timing) before one atomic per channel and block; or adds an fp32
bias (the fully connected layer: a 1x1 convolution over one-pixel images).
"""
import math

from numba import cuda

from . import _conv
from .elementwise import fill_zero
from .gemm import CONV_GEOMETRY
from ._mma import cp_async_16_from, opaque_i32
from .mma_tiles import (BK, CHUNK, SMEM_ALIGN, TILES, choose_tile, kc_offset, make_pipeline, make_staged_store,
                         mma_kernel, staged_barrier, pipeline_bytes, shared_array_words, stage_layout)
from .registry import F1, H1, ZERO, flat, nbt

f16, f32, i32, u32 = nbt.float16, nbt.float32, nbt.int32, nbt.uint32
MAX_TAPS = 15       # filter rows / columns the tensor-core forward takes: a row's valid taps are bits of one uint32


@cuda.jit(device=True)
def bits_between(lo, hi, taps):
    """The bits ``t`` with ``lo <= t < hi`` and ``0 <= t < taps`` (``taps <= MAX_TAPS``): a row's valid taps of one axis."""
    lo, hi = max(i32(0), lo), min(taps, hi)
    return u32(u32(u32(u32(1) << u32(hi)) - u32(1)) ^ u32(u32(u32(1) << u32(lo)) - u32(1))) if hi > lo else u32(0)


@cuda.jit(device=True)
def tap_of(k, c_in, kw_):
    """``(ci, kx, ky)`` of reduction index ``k = (ky * kw_ + kx) * c_in + ci`` (int32; outside the main loop)."""
    t = i32(k // c_in)
    return i32(k - t * c_in), i32(t % kw_), i32(t // kw_)


@cuda.jit(device=True)
def step_tap_bits(ci, bx, by, offs, step, deltas, c_in, kw_, kw_bit, shifts):
    """``(ci, kx, ky)`` moved on by the reduction step whose own ``tap_of`` is ``step``, with the tap held as bits:
    ``bx = 1 << kx``, ``by = 1 << (16 + ky)`` (shifts and two wrap-arounds, no division and no loop: ``kx + step kx
    + 1 < 2 kw_``; the main loop then tests a tap against a row's valid taps with one ``and``), moving two offsets
    linear in the tap, ``offs``, by ``deltas`` (one triple each: per step, more where ``ci`` wraps, more where ``kx``
    wraps; the forward's ``(ky W + kx) c_in + ci``: 0 and ``(W - kw_) c_in``). ``bx`` reaches at most bit ``2 kw_ - 1`` before its wrap; ``by`` runs
    off its word only past the end of the reduction, where the caller's check of its end replaces the tap.
    ``kw_bit`` and ``shifts``: ``tap_step_constants(step, kw_)``."""
    wrap = ci >= i32(c_in - step[0])
    ci = i32(i32(ci + step[0]) - c_in) if wrap else i32(ci + step[0])
    bx = u32(bx << u32(shifts[1] if wrap else shifts[0]))
    o0 = i32(offs[0] + (deltas[0][0] + deltas[0][1] if wrap else deltas[0][0]))
    o1 = i32(offs[1] + (deltas[1][0] + deltas[1][1] if wrap else deltas[1][0]))
    wrap = bx >= kw_bit
    bx = u32(bx >> u32(kw_)) if wrap else bx
    by = u32(by << u32(shifts[3] if wrap else shifts[2]))
    return ci, bx, by, ((i32(o0 + deltas[0][2]), i32(o1 + deltas[1][2])) if wrap else (o0, o1))


@cuda.jit(device=True)
def tap_step_constants(step, kw_):
    """``(kw_bit, shifts)`` of ``step_tap_bits``, for before the main loop: ``1 << kw_``, and ``bx``'s shift without and
    with a channel wrap, then ``by``'s without and with a ``kx`` wrap (``step[1]``, ``step[1] + 1``, ``step[2]``,
    ``step[2] + 1``): one select each in the loop, not a select and an add (dgrad 128x16: 394 -> 385 loop
    instructions). The computed ones pass through ``opaque_i32``: else ptxas recomputes them in the loop (forward
    128x16: 378 -> 373)."""
    kw_bit, bx_wrap, by_wrap = i32(1 << kw_), i32(step[1] + 1), i32(step[2] + 1)
    return u32(opaque_i32(kw_bit)), (step[1], opaque_i32(bx_wrap), step[2], opaque_i32(by_wrap))


@cuda.jit(device=True)
def tap_as_bits(kx, ky):
    """``(1 << kx, 1 << (16 + ky))``: the tap as ``step_tap_bits`` holds it."""
    return u32(u32(1) << u32(kx)), u32(u32(1 << 16) << u32(ky))


EPILOGUES = ("plain", "bn_stats", "bias")


def make_conv_forward(tile, epilogue):
    """The forward kernel of ``tile`` (``Cin % 8 == 0``: 16-byte rows of x and w)."""
    bn_stats, bias = epilogue == "bn_stats", epilogue == "bias"
    T, BM, BN = tile.threads, tile.bm, tile.bn
    ROWS_PER_PASS = T // (BK // CHUNK)
    A_LOADS, B_LOADS = math.ceil(BM / ROWS_PER_PASS), math.ceil(BN / ROWS_PER_PASS)
    A_STAGE, B_STAGE, B_BASE = stage_layout(tile, a_trans=False, b_trans=False)
    SMEM_WORDS = pipeline_bytes(tile, a_trans=False, b_trans=False) // 4
    SMEM_ARRAY = shared_array_words(4 * SMEM_WORDS)   # 0: dynamic shared memory (above 48 KB)
    MI, NI, WTM, WTN, WARPS_M = tile.mi, tile.ni, BM // tile.warps_m, BN // tile.warps_n, tile.warps_m
    ROW_GROUPS = 8 * WARPS_M   # threads sharing an output column: lane >> 2 of each warp row
    if 2 * ROW_GROUPS * BN > SMEM_WORDS:
        raise ValueError(f"tile {tile.name}: the BN-statistics slots need {2 * ROW_GROUPS * BN} words of shared "
                         f"memory, the pipeline has {SMEM_WORDS}")

    @cuda.jit(device=True)
    def issue(smem, window, x, w, stage, k, tap_x, tap_y, off, a_base, a_miss, b_src, dst, geo):
        """Stage the k-tile of this thread's chunk column at ``k`` (tap: the bits ``1 << kx`` and ``1 << (16 + ky)``
        of ``tap_as_bits``; ``off``: the tap's offset in x) into ``stage``."""
        row0 = i32(cuda.threadIdx.x) >> 2
        # this thread's chunk in row i of the stage: rows ROWS_PER_PASS apart share their swizzle (a multiple of 8)
        a_dst, b_dst = i32(dst + stage * A_STAGE), i32(dst + B_BASE + stage * B_STAGE)
        gemm_k = geo[2]
        # LLVM would hold the tap offset as 64 bits at the loop's head and add it to each row pointer in two
        off = opaque_i32(off)   # instructions, not one IMAD.WIDE (128x16: 4.12 -> 3.94)
        k_ok = k < gemm_k
        # past the end of the reduction bit 15, which no row's taps hold (kh, kw <= MAX_TAPS): the copies zero-fill
        q = u32(tap_x | tap_y) if k_ok else u32(1 << MAX_TAPS)
        for i in range(A_LOADS):
            if A_LOADS * ROWS_PER_PASS == BM or row0 + i * ROWS_PER_PASS < BM:   # where a pass overhangs the tile
                # the tap lands inside the image where both its bits are among the row's; the row's address
                # computed once, each copy's one IMAD.WIDE of the tap's offset
                cp_async_16_from(smem, window, i32(a_dst + i * ROWS_PER_PASS * BK * 2), x, a_base[i], off,
                                 u32(q & a_miss[i]) == u32(0))
        # B rows past N read row N - 1 (their columns are never stored): one check for every row
        for i in range(B_LOADS):
            if B_LOADS * ROWS_PER_PASS == BN or row0 + i * ROWS_PER_PASS < BN:
                cp_async_16_from(smem, window, i32(b_dst + i * ROWS_PER_PASS * BK * 2), w, b_src[i], k, k_ok)

    @cuda.jit(device=True)
    def issue_next(smem, window, stage, operands, state):
        x, w, a_base, a_miss, b_src, dst, geo, step, deltas, kw_bit, shifts = operands
        k, ci, tap_x, tap_y, off = state
        issue(smem, window, x, w, stage, k, tap_x, tap_y, off, a_base, a_miss, b_src, dst, geo)
        ci, tap_x, tap_y, offs = step_tap_bits(ci, tap_x, tap_y, (off, i32(0)), step,
                                               (deltas, (i32(0), i32(0), i32(0))), geo[6], geo[11], kw_bit, shifts)
        return i32(k + BK), ci, tap_x, tap_y, offs[0]

    main_loop = make_pipeline(tile, a_trans=False, b_trans=False, issue_next=issue_next, fold_window=True)
    stage_pair, store_staged = make_staged_store(tile, a_trans=False, b_trans=False)

    @cuda.jit(device=True)
    def column_bias(bias_, n):
        """The linear layer's fp32 bias of output column ``n`` (0 past the last column, and without a bias)."""
        if bias:
            return bias_[n] if n < bias_.size else f32(ZERO)
        return f32(ZERO)

    @cuda.jit(device=True)
    def forward(x, w, y, sums, sumsq, geo):
        smem = cuda.shared.array(SMEM_ARRAY, nbt.float32, alignment=SMEM_ALIGN)
        acc = cuda.local.array((MI, NI, 4), nbt.float32)
        a_base = cuda.local.array(A_LOADS, nbt.int32)
        a_miss = cuda.local.array(A_LOADS, nbt.uint32)
        b_src = cuda.local.array(B_LOADS, nbt.int32)
        gemm_m, gemm_n, gemm_k, h_, w_, c_in = geo[0], geo[1], geo[2], geo[4], geo[5], geo[6]
        oh_, ow_, c_out, kh_, kw_, s, p = geo[7], geo[8], geo[9], geo[10], geo[11], geo[12], geo[13]
        tid = cuda.threadIdx.x
        lane, warp = tid & 31, tid >> 5
        warp_m, warp_n = warp % WARPS_M, warp // WARPS_M
        m0, n0 = i32(cuda.blockIdx.x * BM), i32(cuda.blockIdx.y * BN)
        for i in range(A_LOADS):   # this thread's output pixels: the only division of the kernel
            m = m0 + (tid >> 2) + i * ROWS_PER_PASS
            if m < gemm_m:
                ow, t = m % ow_, m // ow_
                oh, b = t % oh_, t // oh_
                a_h, a_w = oh * s - p, ow * s - p
                a_base[i] = ((b * h_ + a_h) * w_ + a_w) * c_in
                # the taps that land inside the image: 0 <= a_h + ky < h, 0 <= a_w + kx < w
                a_miss[i] = ~u32(bits_between(i32(-a_w), i32(w_ - a_w), kw_)
                                 | u32(bits_between(i32(-a_h), i32(h_ - a_h), kh_) << u32(16)))
            else:
                a_base[i], a_miss[i] = i32(0), ~u32(0)
        for i in range(B_LOADS):   # this thread's filter rows (past N: row N - 1, never stored)
            b_src[i] = i32(min(i32(n0 + (tid >> 2) + i * ROWS_PER_PASS), i32(gemm_n - 1)) * gemm_k)
        k = i32((tid & 3) * CHUNK)
        ci, kx, ky = tap_of(k, c_in, kw_)
        step = tap_of(i32(BK), c_in, kw_)
        deltas = (i32(i32(i32(step[2] * w_) + step[1]) * c_in) + step[0], i32(0), i32(i32(w_ - kw_) * c_in))
        tiles = (gemm_k + BK - 1) // BK
        tap_x, tap_y = tap_as_bits(kx, ky)
        dst = kc_offset(i32(tid >> 2), i32(tid & 3))
        kw_bit, shifts = tap_step_constants(step, kw_)
        main_loop(smem, tiles, (x, w, a_base, a_miss, b_src, dst, geo, step, deltas, kw_bit, shifts),
                  (k, ci, tap_x, tap_y, i32(i32(i32(ky * w_) + kx) * c_in) + ci), warp_m, warp_n, acc)
        cuda.syncthreads()   # the pipeline's shared memory is free: stage the fp16 tile there
        for ni in range(NI):
            col = warp_n * WTN + ni * 8 + (lane & 3) * 2
            b0, b1 = column_bias(sums, n0 + col), column_bias(sums, n0 + col + 1)   # the linear layer's, else 0
            for mi in range(MI):
                for half in range(2):
                    row = warp_m * WTM + mi * 16 + (lane >> 2) + half * 8
                    stage_pair(smem, row, col, f16(acc[mi, ni, 2 * half] + b0), f16(acc[mi, ni, 2 * half + 1] + b1))
        staged_barrier()
        store_staged(smem, y, m0, n0, gemm_m, gemm_n, c_out)
        if bn_stats:
            cuda.syncthreads()   # the staged tile is read: its memory takes the statistics' slots
            for ni in range(NI):
                for j in range(2):
                    col = warp_n * WTN + ni * 8 + (lane & 3) * 2 + j
                    part, part_sq = ZERO, ZERO
                    for mi in range(MI):
                        for half in range(2):
                            row = m0 + warp_m * WTM + mi * 16 + (lane >> 2) + half * 8
                            if row < gemm_m and n0 + col < gemm_n:   # the stored (fp16) values
                                v = f32(f16(acc[mi, ni, 2 * half + j]))
                                part += v
                                part_sq += v * v
                    group = warp_m * 8 + (lane >> 2)   # one slot per (row group, column): a fixed-order sum below
                    smem[group * BN + col] = part
                    smem[(ROW_GROUPS + group) * BN + col] = part_sq
        if bn_stats:
            cuda.syncthreads()
            for c in range(tid, min(BN, gemm_n - n0), T):
                total, total_sq = ZERO, ZERO
                for group in range(ROW_GROUPS):
                    total += smem[group * BN + c]
                    total_sq += smem[(ROW_GROUPS + group) * BN + c]
                cuda.atomic.add(sums, n0 + c, total)
                cuda.atomic.add(sumsq, n0 + c, total_sq)

    # the statistics / bias branches are pruned (constants), so unused arguments may have any type
    if bn_stats:
        def conv2d_forward_bn_stats(x, w, y, sums, sumsq, geo):
            forward(x, w, y, sums, sumsq, geo)
        return conv2d_forward_bn_stats, (H1, H1, H1, F1, F1, CONV_GEOMETRY)
    if bias:
        def linear_forward_bias(x, w, bias, y, geo):
            forward(x, w, y, bias, bias, geo)
        return linear_forward_bias, (H1, H1, F1, H1, CONV_GEOMETRY)

    def conv2d_forward(x, w, y, geo):
        forward(x, w, y, y, y, geo)
    return conv2d_forward, (H1, H1, H1, CONV_GEOMETRY)


def _declare(tile, epilogue):
    pyfunc, signature = make_conv_forward(tile, epilogue)
    name = {"plain": "conv2d_forward", "bn_stats": "conv2d_forward_bn_stats", "bias": "linear_forward_bias"}[epilogue]
    return mma_kernel(f"mma_{name}_{tile.name}", signature, pipeline_bytes(tile, a_trans=False, b_trans=False))(pyfunc)


FORWARD = {(tile, epilogue): _declare(tile, epilogue) for tile in TILES for epilogue in EPILOGUES}


def mma_supported(x_shape, w_shape, groups):
    """Whether the tensor-core forward takes this convolution (else the SIMT one does): groups 1, ``Cin % 8 == 0``
    (under AMP the planner pads other groups-1 convolutions to 8k channels, ``padded_conv``), at most ``MAX_TAPS``
    filter rows and columns."""
    return (groups == 1 and w_shape[-1] == x_shape[-1] and w_shape[-1] % CHUNK == 0
            and max(w_shape[1], w_shape[2]) <= MAX_TAPS)


def forward_tile(w_shape, y_size, tiles=None):
    """The block tile ``choose_tile`` gives the forward of weights ``w_shape`` into ``y_size`` outputs."""
    return choose_tile(y_size // w_shape[0], w_shape[0], tiles)


def conv2d_forward(launcher, x, w, y, stride, pad, groups, bn_sums=None, tile=None):
    """``_conv.conv2d_forward`` on tensor cores where ``mma_supported``, else the SIMT kernel.
    ``tile``: a block tile of ``TILES`` instead of ``choose_tile``'s (tests run GPU tiles in the simulator)."""
    if not mma_supported(tuple(x.shape), tuple(w.shape), groups):
        _conv.conv2d_forward(launcher, x, w, y, stride, pad, groups, bn_sums)
        return
    c_out, kh, kw, c_in = w.shape
    pixels = y.size // c_out
    geo = _conv.conv_geometry(x.shape, w.shape, y.shape, stride, pad, groups, pixels, c_out, kh * kw * c_in)
    tile = tile or forward_tile(w.shape, y.size)
    grid = (math.ceil(pixels / tile.bm), math.ceil(c_out / tile.bn), 1)
    if bn_sums is None:
        launcher.launch(FORWARD[tile, "plain"], grid, tile.threads, flat(x), flat(w), flat(y), geo)
        return
    fill_zero(launcher, bn_sums[0])
    fill_zero(launcher, bn_sums[1])
    launcher.launch(FORWARD[tile, "bn_stats"], grid, tile.threads, flat(x), flat(w), flat(y), *bn_sums, geo)
