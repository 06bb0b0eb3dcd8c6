"""Python twins of the tensor-core intrinsics of ``_mma``, for numba's CUDA simulator.

Each twin has the intrinsic's signature (registers in, registers out) and the exact
per-lane semantics of the PTX instruction, written from the PTX ISA tables ("Matrix
fragments for mma.m16n8k16 with floating point type", "Warp-level matrix load
instruction: ldmatrix", "cp.async"), not from the kernels that call them:

- a ``b32`` register holding two ``f16`` is an ``np.uint32`` whose low 16 bits are the
  element of lower column (or row, for ``.trans``) index;
- the warp-collective twins (mma, ldmatrix) exchange the lanes' operands through a
  per-warp scratch in shared memory between two barriers of their own warp only
  (``_warp_barrier``: the 32 lanes, as ``.sync.aligned`` requires), never of the block: the
  warps of a block drift apart between the kernel's own ``syncthreads`` as they do on
  silicon, so a missing block barrier shows here too;
- ``cp.async`` copies are queued per thread and only land at ``wait_group``; at issue
  their destination is poisoned with NaN, so a kernel that reads a stage before every
  thread that fills it has waited for its copies (or overwrites one another warp still
  reads) computes NaN or stale values instead of passing.

The simulator runs these as device functions: its ``cuda`` module is swapped in while
they run (that is how ``cuda.threadIdx`` and ``cuda.shared.array`` reach them).
"""
import threading

import numpy as np
from numba import cuda

WARP = 32
MAX_WARPS = 32
_NAN_F16_BITS = np.uint16(0x7E00)

# --- fragment ownership, straight from the ISA tables (groupID = lane >> 2, tig = lane % 4) ---
_LANES = np.arange(WARP)
_G, _T = _LANES >> 2, _LANES & 3
# A (16x16, row): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
A_ROWS = np.stack([_G, _G + 8, _G, _G + 8], axis=1)          # [lane, reg]
A_COLS = np.stack([2 * _T, 2 * _T, 2 * _T + 8, 2 * _T + 8], axis=1)
# B (16x8, col): b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8.., n = g)
B_ROWS = np.stack([2 * _T, 2 * _T + 8], axis=1)
B_COLS = np.stack([_G, _G], axis=1)
# C / D (16x8 f32): c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1)
C_ROWS = np.stack([_G, _G, _G + 8, _G + 8], axis=1)
C_COLS = np.stack([2 * _T, 2 * _T + 1, 2 * _T, 2 * _T + 1], axis=1)


def pack_half2(lo, hi):
    """The ``b32`` register holding fp16 ``lo`` (bits 0-15) and ``hi`` (bits 16-31)."""
    bits = np.array([lo, hi], dtype=np.float16).view(np.uint16).astype(np.uint32)
    return np.uint32(bits[0] | (bits[1] << 16))


def unpack_half2(reg):
    """``(lo, hi)`` fp16 of a ``b32`` register (inverse of ``pack_half2``)."""
    r = int(reg)
    return np.array([r & 0xFFFF, r >> 16], dtype=np.uint16).view(np.float16)


def _halves(regs):
    """fp16 ``[..., 2]`` (lo, hi) of an array of b32 registers."""
    regs = np.asarray(regs, dtype=np.uint32)
    lo = (regs & 0xFFFF).astype(np.uint16).view(np.float16)
    hi = (regs >> 16).astype(np.uint16).view(np.float16)
    return np.stack([lo, hi], axis=-1)


def _lane_and_warp():
    tid = (cuda.threadIdx.z * cuda.blockDim.y + cuda.threadIdx.y) * cuda.blockDim.x + cuda.threadIdx.x
    return tid % WARP, tid // WARP


_barriers_lock = threading.Lock()
WARP_BARRIER_TIMEOUT = 600.0   # seconds: lanes that never arrive (divergent control flow) raise, not hang


def _warp_barrier(warp):
    """Wait until every lane of ``warp`` arrives (one reusable barrier per warp of the launch; the blocks of a
    launch run one after another, so they can share it)."""
    barriers = cuda.shared.array(MAX_WARPS, np.object_)
    barrier = barriers[warp]
    if barrier is None:
        with _barriers_lock:
            if barriers[warp] is None:
                threads = cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z
                barriers[warp] = threading.Barrier(min(WARP, threads - warp * WARP), timeout=WARP_BARRIER_TIMEOUT)
            barrier = barriers[warp]
    barrier.wait()


@cuda.jit(device=True)
def mma_m16n8k16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """Twin of ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``: D = A @ B + C per warp."""
    lane, warp = _lane_and_warp()
    regs = cuda.shared.array((MAX_WARPS, WARP, 6), np.uint32)
    accs = cuda.shared.array((MAX_WARPS, WARP, 4), np.float32)
    regs[warp, lane, :] = (a0, a1, a2, a3, b0, b1)
    accs[warp, lane, :] = (c0, c1, c2, c3)
    _warp_barrier(warp)
    h = _halves(regs[warp]).astype(np.float64)                 # [lane, reg, lo/hi]
    a, b, c = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
    a[A_ROWS, A_COLS] = h[:, :4, 0]
    a[A_ROWS, A_COLS + 1] = h[:, :4, 1]
    b[B_ROWS, B_COLS] = h[:, 4:, 0]
    b[B_ROWS + 1, B_COLS] = h[:, 4:, 1]
    c[C_ROWS, C_COLS] = accs[warp]
    _warp_barrier(warp)
    d = (a @ b + c).astype(np.float32)   # fp16 products are exact; one fp32 rounding of the sum
    return tuple(d[C_ROWS[lane], C_COLS[lane]])


def _ldmatrix(smem, byte_offset, trans):
    lane, warp = _lane_and_warp()
    addresses = cuda.shared.array((MAX_WARPS, WARP), np.int64)
    if byte_offset % 16:
        raise ValueError(f"ldmatrix: lane {lane} row address {byte_offset} is not 16-byte aligned")
    addresses[warp, lane] = byte_offset
    _warp_barrier(warp)
    halves = smem.view(np.uint16)
    rows = addresses[warp] // 2                       # lanes 8i..8i+7 give the rows of matrix i
    out = []
    for i in range(4):
        mat = np.stack([halves[rows[8 * i + r]:rows[8 * i + r] + 8] for r in range(8)])   # [row, col]
        if trans:
            mat = mat.T
        lo, hi = mat[lane >> 2, 2 * (lane & 3)], mat[lane >> 2, 2 * (lane & 3) + 1]
        out.append(np.uint32(int(lo) | (int(hi) << 16)))
    _warp_barrier(warp)
    return out[0], out[1], out[2], out[3]


@cuda.jit(device=True)
def ldmatrix_x4(smem, byte_offset):
    """Twin of ``ldmatrix.sync.aligned.m8n8.x4.shared.b16``."""
    return _ldmatrix(smem, byte_offset, False)


@cuda.jit(device=True)
def ldmatrix_x4_trans(smem, byte_offset):
    """Twin of ``ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16``."""
    return _ldmatrix(smem, byte_offset, True)


_pending = threading.local()   # the simulator runs one Python thread per CUDA thread


def _queues():
    if not hasattr(_pending, "open"):
        _pending.open, _pending.committed = [], []
    return _pending


@cuda.jit(device=True)
def cp_async_16(smem, byte_offset, src, index, valid):
    """Twin of ``cp.async.cg.shared.global [dst], [src], 16, valid ? 16 : 0`` (zero-fill)."""
    if byte_offset % 16 or (valid and index % 8):
        raise ValueError(f"cp.async: destination byte {byte_offset} / source element {index} not 16-byte aligned")
    if valid and not 0 <= index <= src.size - 8:   # (a negative index would silently wrap around in numpy)
        raise IndexError(f"cp.async: a copy of source elements {index}..{index + 7}, outside the array's "
                         f"{src.size}; only a zero-fill copy (valid 0) may point anywhere")
    dst = smem.view(np.uint16)
    start = byte_offset // 2
    dst[start:start + 8] = _NAN_F16_BITS
    _queues().open.append((dst, start, src, index, bool(valid)))


@cuda.jit(device=True)
def cp_async_commit():
    """Twin of ``cp.async.commit_group``."""
    q = _queues()
    q.committed.append(q.open)
    q.open = []


def _land(group):
    for dst, start, src, index, valid in group:
        if valid:
            dst[start:start + 8] = np.array([src[index + j] for j in range(8)], np.float16).view(np.uint16)
        else:
            dst[start:start + 8] = 0


@cuda.jit(device=True)
def pack_half2_device(lo, hi):
    """Twin of ``_mma.pack_half2``."""
    return pack_half2(lo, hi)


@cuda.jit(device=True)
def unpack_half2_device(reg):
    """Twin of ``_mma.unpack_half2``."""
    lo, hi = unpack_half2(reg)
    return lo, hi


def _vector_slice(array, index, what):
    if index % 8 or index < 0 or index + 8 > array.size:
        raise ValueError(f"{what}: element {index} of an fp16 array of {array.size} is not the start of a "
                         f"16-byte vector inside it (index % 8 == 0 and index + 8 <= size)")
    return slice(index, index + 8)


@cuda.jit(device=True)
def ld_global_v4(array, index):
    """Twin of ``ld.global[.nc].v4.b32``: 8 fp16 from element ``index`` as four b32 registers."""
    where = _vector_slice(array, index, "ld.global.v4")
    r = np.array([array[i] for i in range(where.start, where.stop)], np.float16).view(np.uint32)
    return r[0], r[1], r[2], r[3]


@cuda.jit(device=True)
def st_global_v4(array, index, r0, r1, r2, r3):
    """Twin of ``st.global.v4.b32``: four b32 registers as 8 fp16 from element ``index``."""
    where = _vector_slice(array, index, "st.global.v4")
    halves = np.array([r0, r1, r2, r3], np.uint32).view(np.float16)
    for j in range(8):
        array[where.start + j] = halves[j]


@cuda.jit(device=True)
def st_shared_b32(smem, byte_offset, r):
    """Twin of ``st.shared.b32`` (4-byte aligned)."""
    if byte_offset % 4:
        raise ValueError(f"st.shared.b32: byte offset {byte_offset} is not 4-byte aligned")
    smem.view(np.uint32)[byte_offset // 4] = r


@cuda.jit(device=True)
def ld_shared_v4(smem, byte_offset):
    """Twin of ``ld.shared.v4.b32`` (16-byte aligned)."""
    if byte_offset % 16:
        raise ValueError(f"ld.shared.v4: byte offset {byte_offset} is not 16-byte aligned")
    r = smem.view(np.uint32)[byte_offset // 4:byte_offset // 4 + 4]
    return r[0], r[1], r[2], r[3]


@cuda.jit(device=True)
def red_add_v4(array, index, v0, v1, v2, v3):
    """Twin of ``red.global.add.v4.f32``: four fp32 atomic adds from element ``index`` (``index % 4 == 0``)."""
    if index % 4 or index < 0 or index + 4 > array.size:
        raise ValueError(f"red.global.add.v4.f32: element {index} of an fp32 array of {array.size} is not the "
                         f"start of a 16-byte vector inside it")
    for j, v in enumerate((v0, v1, v2, v3)):
        cuda.atomic.add(array, index + j, v)


@cuda.jit(device=True)
def swap_pair(v0, v1):
    """Twin of two ``shfl.sync.bfly.b32`` with lane mask 1 (full warp): lane ``l`` gets lane ``l ^ 1``'s values."""
    lane, warp = _lane_and_warp()
    vals = cuda.shared.array((MAX_WARPS, WARP, 2), np.float32)
    vals[warp, lane, :] = (v0, v1)
    _warp_barrier(warp)
    w0, w1 = vals[warp, lane ^ 1, 0], vals[warp, lane ^ 1, 1]
    _warp_barrier(warp)
    return w0, w1


def cp_async_wait(pending):
    """Twin of ``cp.async.wait_group pending``: all but the newest ``pending`` groups land."""
    @cuda.jit(device=True)
    def wait_group():
        q = _queues()
        while len(q.committed) > pending:
            _land(q.committed.pop(0))
    return wait_group
