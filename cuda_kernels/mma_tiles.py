"""Block tiles of the tensor-core GEMM kernels and the warp-level step they share.

A block computes a ``bm x bn`` tile of ``C = A @ B`` with ``warps_m x warps_n`` warps, each
owning a ``(bm / warps_m) x (bn / warps_n)`` warp tile of ``mi x ni`` m16n8 fragments; the
reduction advances ``BK = 32`` at a time through a ``STAGES``-deep ``cp.async`` pipeline.

Shared memory, one float32 array reused by the epilogue; per stage an A then a B tile:
- K-contiguous operand (rows = m or n, 32 fp16 of k = four 16-byte chunks per row): chunk
  ``c`` of row ``r`` sits at ``64 r + 16 (c ^ ((r >> 1) & 3))``. The 8 rows one ldmatrix
  phase reads then fall on 8 distinct 16-byte bank groups (no conflicts), without padding,
  so a 128x128 tile with 3 stages takes exactly the 48 KB of static shared memory.
- MN-contiguous operand (rows = k, ``width`` fp16 of m or n per row, read with ``.trans``):
  rows padded by 16 bytes; ``(width + 8) / 8`` is odd for every width here, so 8
  consecutive rows hit 8 distinct bank groups.

A pipeline of at most 48 KB is a static shared array; a larger one (128x128 with a padded
``.trans`` operand: 49.5 KB for the input gradient, 51 KB for the weight gradient) is dynamic
shared memory, its kernel registered with ``dynamic_shared_bytes`` (``dynamic_smem``).
"""
import inspect
import math
from dataclasses import dataclass

from numba import cuda

from .dynamic_smem import STATIC_SHARED_LIMIT
from ._mma import (cp_async_commit, cp_async_wait, ld_shared_v4, ldmatrix_x4_at, ldmatrix_x4_trans_at,
                   mma_m16n8k16, opaque_i32, pack_half2, shared_window, st_global_v4, st_shared_b32, unpack_half2)
from .registry import SIMULATOR, ZERO, KernelSpec, jit_kernel, nbt

BK = 32
STAGES = 3
H200_SMS = 132
CHUNK = 8   # fp16 per 16-byte cp.async / ldmatrix row
# ldmatrix / cp.async need 16-byte aligned shared addresses; numba aligns a float32
# shared array to 4 bytes unless told (the simulator refuses the argument, and needs none)
SMEM_ALIGN = None if SIMULATOR else 128


@dataclass(frozen=True)
class MmaTile:
    bm: int
    bn: int
    warps_m: int
    warps_n: int

    @property
    def name(self):
        return f"{self.bm}x{self.bn}x{BK}"

    @property
    def threads(self):
        return 32 * self.warps_m * self.warps_n

    @property
    def design_blocks_per_sm(self):
        """Resident blocks per SM the tile is designed for (register budget: 65536 / (threads * blocks))."""
        return 1 if self.threads >= 256 else 2

    @property
    def mi(self):
        return self.bm // self.warps_m // 16

    @property
    def ni(self):
        return self.bn // self.warps_n // 8

    def __post_init__(self):
        if self.bm % (16 * self.warps_m) or self.bn % (16 * self.warps_n):
            raise ValueError(f"MmaTile {self.bm}x{self.bn}: warp tiles must be multiples of 16x16, "
                             f"got {self.warps_m}x{self.warps_n} warps")


# Widest first; ``choose_tile`` takes the first whose width fits and that fills the GPU.
# The narrow tiles have fewer, larger warp tiles (128x32: two warps of 64x32; 128x16: one warp of 128x16): a
# k-tile's staging, tap step, barrier and waits cost a warp about as much whatever its share of the tile, so with
# four warps of 32x32 / 32x16 (16 / 8 HMMAs per k-tile) they took 4.2-7.3 main-loop instructions per HMMA
# (issue 23); 32 HMMAs per warp and k-tile bring that to 3.0-4.3 (``python -m benchmarks.sass_report``).
GPU_TILES = (MmaTile(128, 128, 2, 4), MmaTile(128, 64, 2, 2), MmaTile(64, 64, 2, 2),
             MmaTile(128, 32, 2, 1), MmaTile(128, 16, 1, 1))
# The simulator runs ~10k threads/s: two warps, a 32x16 tile (tests also run a GPU tile).
SIM_TILE = MmaTile(32, 16, 2, 1)
TILES = GPU_TILES + (SIM_TILE,)


def choose_tile(m, n, tiles=None, min_blocks=H200_SMS):
    """The block tile (of ``tiles``, default ``GPU_TILES``) for a GEMM of ``m x n`` outputs: none
    larger than ``m`` / ``n`` need (no tile mostly padding), the largest that still gives
    ``min_blocks`` blocks (a block per SM of an H200), else the smallest. A split reduction
    fills the GPU by itself: the weight gradient asks for ``min_blocks=1``."""
    if SIMULATOR:
        return SIM_TILE

    def cap(extent, least):
        return max(least, 1 << max(0, math.ceil(math.log2(max(extent, 1)))))
    candidates = [t for t in (tiles or GPU_TILES) if t in GPU_TILES]
    fitting = [t for t in candidates if t.bn <= cap(n, 16) and t.bm <= cap(m, 64)] or sorted(
        candidates, key=lambda t: (math.ceil(m / t.bm) * t.bm * math.ceil(n / t.bn) * t.bn, -t.bm * t.bn))[:1]
    for tile in fitting:   # GPU_TILES is ordered by area, largest first
        if math.ceil(m / tile.bm) * math.ceil(n / tile.bn) >= min_blocks:
            return tile
    return fitting[-1]


def k_contiguous_bytes(rows):
    return rows * BK * 2


def mn_contiguous_bytes(width):
    return BK * (width + CHUNK) * 2


def stage_layout(tile, a_trans, b_trans):
    """``(a_stage, b_stage, b_base)`` bytes: one stage's A and B tiles, and where the B stages start (after the
    ``STAGES`` A tiles); ``*_trans``: that operand MN-contiguous (padded rows)."""
    a = mn_contiguous_bytes(tile.bm) if a_trans else k_contiguous_bytes(tile.bm)
    b = mn_contiguous_bytes(tile.bn) if b_trans else k_contiguous_bytes(tile.bn)
    return a, b, STAGES * a


def pipeline_bytes(tile, a_trans, b_trans):
    """Shared bytes of ``tile``'s ``STAGES``-deep pipeline (``stage_layout``'s stages)."""
    a_stage, b_stage, _ = stage_layout(tile, a_trans, b_trans)
    return STAGES * (a_stage + b_stage)


def dynamic_shared_bytes(nbytes):
    """The dynamic shared memory a pipeline of ``nbytes`` is launched with: 0 when it fits a static array."""
    return 0 if nbytes <= STATIC_SHARED_LIMIT else nbytes


def shared_array_words(nbytes):
    """The ``cuda.shared.array`` length (float32 words) of a pipeline of ``nbytes``: 0 (dynamic) above 48 KB."""
    return 0 if dynamic_shared_bytes(nbytes) else nbytes // 4


@cuda.jit(device=True)
def kc_offset(row, chunk):
    """Byte offset of 16-byte ``chunk`` of ``row`` in a swizzled K-contiguous tile."""
    return row * (BK * 2) + ((chunk ^ ((row >> 1) & 3)) << 4)


def make_warp_step(tile, a_trans, b_trans):
    """``(fragment_offsets, warp_step)`` of a warp's ``mi x ni`` mma over one BK slice.

    ``fragment_offsets(warp_m, warp_n, a_off, b_off)`` fills this lane's ldmatrix row offsets of the
    warp's first A / B fragment (int32 ``(BK // 16,)`` bytes from a stage's tile; the others lie constant
    steps further): they do not change along the reduction, so the main loop only adds a stage's base. ``*_trans``: that
    operand is stored MN-contiguous (rows = k) and read with ``ldmatrix.trans``.
    ``warp_step(smem, window, a_base, b_base, a_off, b_off, acc)`` runs the slice whose tiles start at
    bytes ``a_base`` / ``b_base`` (``window``: ``shared_window(smem)``)."""
    MI, NI, KK = tile.mi, tile.ni, BK // 16
    WTM, WTN = tile.bm // tile.warps_m, tile.bn // tile.warps_n
    A_ROW, B_ROW = (tile.bm + CHUNK) * 2, (tile.bn + CHUNK) * 2
    # the next 16 rows (m or n) of a fragment: 16 swizzled rows further (the swizzle repeats every 8 rows),
    # or 16 fp16 along a padded row (``.trans``): a constant the ldmatrix address takes as an immediate
    A_STEP, B_STEP = 32 if a_trans else 16 * BK * 2, 32 if b_trans else 16 * BK * 2
    u32, i32 = nbt.uint32, nbt.int32

    @cuda.jit(device=True)
    def fragment_offsets(warp_m, warp_n, a_off, b_off):
        lane = i32(cuda.threadIdx.x & 31)
        m, n = i32(warp_m * WTM), i32(warp_n * WTN)
        for kk in range(KK):
            if a_trans:   # matrices: (m 0-7, k 0-7) (m 8-15, k 0-7) (m 0-7, k 8-15) (m 8-15, k 8-15)
                k = kk * 16 + (lane & 7) + ((lane >> 4) << 3)
                a_off[kk] = i32(k * A_ROW + (m + (((lane >> 3) & 1) << 3)) * 2)
            else:
                a_off[kk] = i32(kc_offset(m + (lane & 15), kk * 2 + (lane >> 4)))
            if b_trans:   # matrices: (k 0-7, n 0-7) (k 8-15, n 0-7) (k 0-7, n 8-15) (k 8-15, n 8-15)
                k = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3)
                b_off[kk] = i32(k * B_ROW + (n + ((lane >> 4) << 3)) * 2)
            else:         # matrices: (n 0-7, k 0-7) (n 0-7, k 8-15) (n 8-15, k 0-7) (n 8-15, k 8-15)
                b_off[kk] = i32(kc_offset(n + ((lane >> 4) << 3) + (lane & 7), kk * 2 + ((lane >> 3) & 1)))

    @cuda.jit(device=True)
    def warp_step(smem, window, a_base, b_base, a_off, b_off, acc):
        af = cuda.local.array((MI, 4), u32)
        bf = cuda.local.array((NI, 2), u32)
        for kk in range(KK):
            a_kk, b_kk = i32(a_base + a_off[kk]), i32(b_base + b_off[kk])
            for mi in range(MI):
                if a_trans:
                    r = ldmatrix_x4_trans_at(smem, window, i32(a_kk + mi * A_STEP))
                else:
                    r = ldmatrix_x4_at(smem, window, i32(a_kk + mi * A_STEP))
                af[mi, 0], af[mi, 1], af[mi, 2], af[mi, 3] = r[0], r[1], r[2], r[3]
            for nj in range(NI // 2):
                if b_trans:
                    r = ldmatrix_x4_trans_at(smem, window, i32(b_kk + nj * B_STEP))
                else:
                    r = ldmatrix_x4_at(smem, window, i32(b_kk + nj * B_STEP))
                bf[2 * nj, 0], bf[2 * nj, 1], bf[2 * nj + 1, 0], bf[2 * nj + 1, 1] = r[0], r[1], r[2], r[3]
            for mi in range(MI):
                for ni in range(NI):
                    acc[mi, ni, 0], acc[mi, ni, 1], acc[mi, ni, 2], acc[mi, ni, 3] = mma_m16n8k16(
                        af[mi, 0], af[mi, 1], af[mi, 2], af[mi, 3], bf[ni, 0], bf[ni, 1],
                        acc[mi, ni, 0], acc[mi, ni, 1], acc[mi, ni, 2], acc[mi, ni, 3])
    return fragment_offsets, warp_step


@cuda.jit(device=True)
def block_barrier():
    """``bar.sync``: the main loop's one block barrier. A module-level name, so that the simulator tier's
    mutation test can delete it (``tests/cuda/test_mma_twins.py``) and see the pipeline break."""
    cuda.syncthreads()


@cuda.jit(device=True)
def staged_barrier():
    """``bar.sync`` between an epilogue's writes of its staged output tile and the reads of other threads' values
    (module-level, like ``block_barrier``: the simulator tier's mutation test deletes it and sees the stores break)."""
    cuda.syncthreads()


def make_pipeline(tile, a_trans, b_trans, issue_next, issue_first=None, fold_window=False):
    """The ``STAGES``-deep ``cp.async`` main loop the forward, input- and weight-gradient kernels share:

        prologue: tiles 0 .. STAGES-2 in flight (one commit group each, empty past the end)
        iteration kt: wait until tile kt landed; syncthreads (which also retires stage kt-1);
                      issue tile kt+STAGES-1 into the stage kt-1 used; mma on stage kt

    The loop body runs ``STAGES`` k-tiles (each stage a constant: immediate offsets in the ldmatrix / cp.async
    addresses, no stage counters); its loop branch, counter and compare are paid once per ``STAGES`` k-tiles. The
    first ``tiles % STAGES`` k-tiles run before it, the ring started that many stages early so the loop starts at 0. It issues unconditionally:
    a k-tile past the end must be all zero-fill (every ``issue_next`` makes its copies invalid there), lands
    in a stage no mma reads, and costs no branch in the loop.

    ``issue_next(smem, window, stage, operands, state) -> state`` stages the kernel's next k-tile into ``stage``
    (its A tile at byte ``stage * a_stage``, its B tile at ``b_base + stage * b_stage``, the layout
    ``stage_layout`` gives; ``window``: ``shared_window(smem)``) and returns ``state`` advanced by ``BK``: two
    tuples of the kernel's choosing, ``operands`` fixed (arrays: kept out of the loop-carried state, LLVM then
    keeps the per-thread coordinate arrays in registers), ``state`` scalars of unchanging types.
    ``issue_first`` (default ``issue_next``), with the same signature, stages k-tile 0 (in the prologue): a kernel whose
    only partial k-tile is its first checks rows there, and the loop's ``issue_next`` need not.
    ``main_loop(smem, tiles, operands, state, warp_m, warp_n, acc)`` zeroes the warp's fp32 accumulators
    ``acc[mi, ni, 4]``, runs ``tiles`` k-tiles and returns with every copy landed (an epilogue that
    reuses ``smem`` syncs the block first)."""
    if STAGES != 3:
        raise ValueError("make_pipeline: the loop body is written out for 3 stages")
    MI, NI, KK = tile.mi, tile.ni, BK // 16
    A_STAGE, B_STAGE, B_BASE = stage_layout(tile, a_trans, b_trans)
    fragment_offsets, warp_step = make_warp_step(tile, a_trans, b_trans)
    wait_stage, wait_all = cp_async_wait(STAGES - 2), cp_async_wait(0)
    i32 = nbt.int32
    issue_zero = issue_first or issue_next

    @cuda.jit(device=True)
    def k_tile(smem, window, read, operands, state, a_off, b_off, acc):
        """One k-tile on stage ``read`` (a constant), issuing the tile ``STAGES - 1`` ahead into the stage before it."""
        wait_stage()
        block_barrier()
        state = issue_next(smem, window, i32(i32(read + STAGES - 1) % STAGES), operands, state)
        cp_async_commit()
        warp_step(smem, nbt.uint32(0) if fold_window else window, i32(read * A_STAGE), i32(B_BASE + read * B_STAGE),
                  a_off, b_off, acc)
        return state

    @cuda.jit(device=True)
    def main_loop(smem, tiles, operands, state, warp_m, warp_n, acc):
        a_off = cuda.local.array(KK, nbt.int32)
        b_off = cuda.local.array(KK, nbt.int32)
        fragment_offsets(warp_m, warp_n, a_off, b_off)
        window = shared_window(smem)
        if fold_window:   # the window added to the fragment offsets once (``warp_step`` then gets 0): each ldmatrix
            # address one register plus an immediate; else ptxas may recompute window + offset + stage in the loop
            # under register pressure (dgrad 128x16: 234 -> 168 registers, 416 -> 394 loop instructions; the weight
            # gradient's 64x64 loses by it: it does not fold)
            for kk in range(KK):
                a_off[kk] = opaque_i32(i32(window + a_off[kk]))
                b_off[kk] = opaque_i32(i32(window + b_off[kk]))
        for mi in range(MI):
            for ni in range(NI):
                for r in range(4):
                    acc[mi, ni, r] = ZERO
        tiles = i32(tiles)
        # the first ``tiles % STAGES`` k-tiles run before the loop, from stage ``first``: the loop then starts at
        # stage 0 and runs whole rounds of STAGES k-tiles (counter, compare and branch once per round)
        rest = i32(tiles - i32(i32(tiles // STAGES) * STAGES))
        first = i32(STAGES - rest) if rest > 0 else i32(0)
        if tiles > 0:
            state = issue_zero(smem, window, first, operands, state)
        cp_async_commit()
        for stage in range(1, STAGES - 1):
            if stage < tiles:
                state = issue_next(smem, window, i32(first + stage) % STAGES, operands, state)
            cp_async_commit()
        if rest > 0:   # written out: no loop (the SASS report's main loop is the one around the rounds)
            state = k_tile(smem, window, first, operands, state, a_off, b_off, acc)
        if rest > 1:
            state = k_tile(smem, window, i32(first + 1), operands, state, a_off, b_off, acc)
        rounds = i32(tiles // STAGES)
        while rounds > 0:
            state = k_tile(smem, window, 0, operands, state, a_off, b_off, acc)
            state = k_tile(smem, window, 1, operands, state, a_off, b_off, acc)
            state = k_tile(smem, window, 2, operands, state, a_off, b_off, acc)
            rounds = i32(rounds - 1)
        wait_all()
    return main_loop


def staged_bytes(tile):
    """Shared bytes of ``tile``'s fp16 output staged for 16-byte stores: rows of ``bn + 8`` fp16 (16 bytes of
    padding: a warp's fp16 pairs, rows ``lane >> 2`` and columns ``2 (lane % 4)``, fall on 32 distinct banks)."""
    return tile.bm * (tile.bn + CHUNK) * 2


def make_staged_store(tile, a_trans, b_trans):
    """``(stage_pair, store_staged)``: the epilogue's 16-byte global stores of a ``bm x bn`` fp16 tile.

    ``stage_pair(smem, row, col, v0, v1)`` writes two fp16 (columns ``col``, ``col + 1`` of tile row ``row``) into
    the staged tile (the pipeline's shared memory, free after the main loop and a ``syncthreads``); after
    ``staged_barrier()``, ``store_staged(smem, out, m0, n0, rows, cols, ld)`` writes every in-bounds element:
    thread ``t`` moves 8 columns (16 bytes) of rows ``t // (bn / 8) + pass * rows_per_pass``, row ``r`` of the tile
    at ``out[m0 + r, n0:]`` with row pitch ``ld`` (``ld % 8 == 0`` and ``cols % 8 == 0``: ``st.global.v4``;
    otherwise 8 scalar stores, each checked against ``cols``)."""
    if staged_bytes(tile) > pipeline_bytes(tile, a_trans, b_trans):
        raise ValueError(f"tile {tile.name}: the staged output ({staged_bytes(tile)} bytes) exceeds its pipeline")
    BM, BN, T = tile.bm, tile.bn, tile.threads
    ROW = (BN + CHUNK) * 2     # bytes per staged row
    CPR = BN // CHUNK          # 16-byte chunks per row
    RPP = T // CPR             # rows per pass of the block
    PASSES = -(-BM // RPP)
    f16, i32 = nbt.float16, nbt.int32

    @cuda.jit(device=True)
    def stage_pair(smem, row, col, v0, v1):
        st_shared_b32(smem, i32(i32(row * ROW) + col * 2), pack_half2(f16(v0), f16(v1)))

    @cuda.jit(device=True)
    def store_staged(smem, out, m0, n0, rows, cols, ld):
        tid = i32(cuda.threadIdx.x)
        c = i32((tid % CPR) * CHUNK)
        vector = ld % CHUNK == 0 and cols % CHUNK == 0
        for p in range(PASSES):
            r = i32(tid // CPR + p * RPP)
            if (PASSES * RPP == BM or r < BM) and m0 + r < rows and n0 + c < cols:
                r0, r1, r2, r3 = ld_shared_v4(smem, i32(r * ROW + c * 2))
                at = i32(i32(i32(m0 + r) * ld) + n0 + c)
                if vector:
                    st_global_v4(out, at, r0, r1, r2, r3)
                else:   # rows not 16-byte aligned (ld % 8 != 0): fp16 at a time, the last chunk partial
                    regs = (r0, r1, r2, r3)
                    for j in range(CHUNK // 2):
                        lo, hi = unpack_half2(regs[j])
                        if n0 + c + 2 * j < cols:
                            out[at + 2 * j] = lo
                        if n0 + c + 2 * j + 1 < cols:
                            out[at + 2 * j + 1] = hi
    return stage_pair, store_staged


# The tensor-core kernels' own table (``registry.KERNELS`` holds the SIMT reference set, whose
# simulator tests require every row launched; most tiles here only run on a GPU).
MMA_KERNELS = {}


def mma_kernel(name, signature, shared_bytes=0):
    """Like ``registry.kernel``, into ``MMA_KERNELS``; ``shared_bytes``: its pipeline's, launched as dynamic
    shared memory above 48 KB (the kernel declares ``shared_array_words(shared_bytes)``)."""
    def declare(pyfunc):
        if name in MMA_KERNELS:
            raise ValueError(f"mma_kernel: duplicate kernel name {name!r}")
        spec = KernelSpec(name, pyfunc, jit_kernel(pyfunc, name), tuple(signature), tuple(inspect.signature(pyfunc).parameters),
                          dynamic_shared_bytes(shared_bytes))
        MMA_KERNELS[name] = spec
        return spec
    return declare
