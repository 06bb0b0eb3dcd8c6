"""The simulator twins of the tensor-core intrinsics against a plain matrix product.

Fragments are built here by hand from the PTX ISA tables (per lane, with the ISA's own
formulas), independently of ``_mma_twins``; two warps run different data so a twin that
mixes warps fails. Simulator tier only (on a GPU the same kernels run the real instructions).
"""
import numpy as np
import pytest
from numba import cuda

from cuda_kernels._mma import (cp_async_16, cp_async_commit, cp_async_wait, ldmatrix_x4, ldmatrix_x4_trans,
                               mma_m16n8k16)
from cuda_kernels._mma_twins import pack_half2 as host_pack, unpack_half2

WARPS = 2
rng = np.random.default_rng(12)


def _operands(warps=WARPS):
    a = rng.integers(-8, 8, (warps, 16, 16)).astype(np.float16) / np.float16(4)
    b = rng.integers(-8, 8, (warps, 16, 8)).astype(np.float16) / np.float16(4)
    c = rng.standard_normal((warps, 16, 8)).astype(np.float32)
    return a, b, c


def _isa_fragments(a, b, c):
    """Per lane: a0..a3, b0, b1 (b32) and c0..c3, from the ISA's "fragments for mma.m16n8k16"."""
    regs, accs = np.zeros((32, 6), np.uint32), np.zeros((32, 4), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i, (row, col) in enumerate([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]):
            regs[lane, i] = host_pack(a[row, col], a[row, col + 1])
        for i, k in enumerate([2 * t, 2 * t + 8]):
            regs[lane, 4 + i] = host_pack(b[k, g], b[k + 1, g])
        accs[lane] = [c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1]]
    return regs, accs


def _d_from_lanes(d):
    out = np.zeros((16, 8), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        out[g, 2 * t], out[g, 2 * t + 1], out[g + 8, 2 * t], out[g + 8, 2 * t + 1] = d[lane]
    return out


@cuda.jit
def _mma_kernel(regs, accs, d):
    tid = cuda.threadIdx.x
    r = regs[tid]
    c = accs[tid]
    d[tid, 0], d[tid, 1], d[tid, 2], d[tid, 3] = mma_m16n8k16(r[0], r[1], r[2], r[3], r[4], r[5],
                                                              c[0], c[1], c[2], c[3])


def test_pack_half2_puts_the_first_element_in_the_low_half():
    reg = host_pack(np.float16(1.0), np.float16(-2.0))
    assert reg == np.uint32(0xC000_3C00)
    assert list(unpack_half2(reg)) == [1.0, -2.0]


def test_mma_twin_is_a_times_b_plus_c_per_warp():
    a, b, c = _operands()
    frags = [_isa_fragments(a[w], b[w], c[w]) for w in range(WARPS)]
    regs = np.concatenate([f[0] for f in frags])
    accs = np.concatenate([f[1] for f in frags])
    d = np.zeros((32 * WARPS, 4), np.float32)
    _mma_kernel[1, 32 * WARPS](regs, accs, d)
    for w in range(WARPS):
        expected = a[w].astype(np.float64) @ b[w].astype(np.float64) + c[w]
        np.testing.assert_allclose(_d_from_lanes(d[32 * w:32 * (w + 1)]), expected, rtol=1e-6, atol=1e-6)


@cuda.jit
def _ldmatrix_mma_kernel(a_rows, b_rows, b_kmajor, d, d_trans):
    """A (16x16 row-major), B stored n-major (8 rows of 16 k, twice: two n8 tiles) and k-major
    (16 rows of 16 n), all loaded with one plain copy, then fragments by ldmatrix."""
    smem = cuda.shared.array(768, np.float16)
    lane, warp = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32
    base = warp * 768 // WARPS
    for e in range(lane, 256, 32):
        smem[base + e] = a_rows[warp * 256 + e]
    for e in range(lane, 128, 32):   # only 256 halves of B fit with A in this warp's 384
        smem[base + 256 + e] = b_rows[warp * 128 + e]
    cuda.syncthreads()
    # A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
    a0, a1, a2, a3 = ldmatrix_x4(smem, 2 * (base + (lane % 16) * 16 + (lane // 16) * 8))
    # B n-major (8 n x 16 k): matrices (k 0-7), (k 8-15); lanes 16-31 repeat them (x4 reads 4)
    b0, b1, _, _ = ldmatrix_x4(smem, 2 * (base + 256 + (lane % 8) * 16 + ((lane // 8) % 2) * 8))
    zero = np.float32(0)
    d[cuda.threadIdx.x, 0], d[cuda.threadIdx.x, 1], d[cuda.threadIdx.x, 2], d[cuda.threadIdx.x, 3] = \
        mma_m16n8k16(a0, a1, a2, a3, b0, b1, zero, zero, zero, zero)
    cuda.syncthreads()
    # B k-major (16 k rows x 8 n): .trans of matrices (k 0-7) and (k 8-15)
    for e in range(lane, 128, 32):
        smem[base + 256 + e] = b_kmajor[warp * 128 + e]
    cuda.syncthreads()
    t0, t1, _, _ = ldmatrix_x4_trans(smem, 2 * (base + 256 + (lane % 16) * 8))
    d_trans[cuda.threadIdx.x, 0], d_trans[cuda.threadIdx.x, 1], d_trans[cuda.threadIdx.x, 2], \
        d_trans[cuda.threadIdx.x, 3] = mma_m16n8k16(a0, a1, a2, a3, t0, t1, zero, zero, zero, zero)


def test_ldmatrix_rows_and_trans_give_the_mma_fragments():
    a, b, _ = _operands()
    d, d_trans = np.zeros((32 * WARPS, 4), np.float32), np.zeros((32 * WARPS, 4), np.float32)
    b_nmajor = np.ascontiguousarray(b.transpose(0, 2, 1))          # [warp, n, k]
    _ldmatrix_mma_kernel[1, 32 * WARPS](a.reshape(-1), b_nmajor.reshape(-1), b.reshape(-1).copy(), d, d_trans)
    for w in range(WARPS):
        expected = a[w].astype(np.float64) @ b[w].astype(np.float64)
        np.testing.assert_allclose(_d_from_lanes(d[32 * w:32 * (w + 1)]), expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(_d_from_lanes(d_trans[32 * w:32 * (w + 1)]), expected, rtol=1e-6, atol=1e-6)


@cuda.jit
def _ldmatrix_lane_kernel(src, out, trans):
    smem = cuda.shared.array(256, np.float16)
    lane = cuda.threadIdx.x
    for e in range(lane, 256, 32):
        smem[e] = src[e]
    cuda.syncthreads()
    # matrix i = rows 8i..8i+7 of a 32x8 row-major array; lane l gives row l
    if trans:
        r = ldmatrix_x4_trans(smem, 16 * lane)
    else:
        r = ldmatrix_x4(smem, 16 * lane)
    for i in range(4):
        out[lane, i] = r[i]


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_lane_ownership_matches_the_isa_table(trans):
    src = np.arange(256).astype(np.float16)
    out = np.zeros((32, 4), np.uint32)
    _ldmatrix_lane_kernel[1, 32](src, out, trans)
    mats = src.reshape(4, 8, 8)
    for lane in range(32):
        row, col = lane // 4, 2 * (lane % 4)
        for i in range(4):
            m = mats[i].T if trans else mats[i]
            assert list(unpack_half2(out[lane, i])) == [m[row, col], m[row, col + 1]], (lane, i)


WAIT_ALL, WAIT_ONE = cp_async_wait(0), cp_async_wait(1)


@cuda.jit
def _cp_async_kernel(src, early, late):
    smem = cuda.shared.array(512, np.float16)
    lane = cuda.threadIdx.x
    cp_async_16(smem, 16 * lane, src, 8 * lane, lane % 3 != 0)            # group 0: zero-fill every third
    cp_async_commit()
    cp_async_16(smem, 512 + 16 * lane, src, 256 + 8 * lane, 1)             # group 1
    cp_async_commit()
    WAIT_ONE()                                                             # group 0 landed, 1 maybe not
    cuda.syncthreads()
    for e in range(lane, 512, 32):
        early[e] = smem[e]
    cuda.syncthreads()
    WAIT_ALL()
    cuda.syncthreads()
    for e in range(lane, 512, 32):
        late[e] = smem[e]


def test_cp_async_lands_at_wait_group_with_zero_fill():
    src = (np.arange(512) + 1).astype(np.float16)
    early, late = np.zeros(512, np.float16), np.zeros(512, np.float16)
    _cp_async_kernel[1, 32](src, early, late)
    expected = src.copy()
    for lane in range(0, 32, 3):
        expected[8 * lane:8 * lane + 8] = 0
    np.testing.assert_array_equal(late, expected)
    np.testing.assert_array_equal(early[:256], expected[:256])
    # the twin delays the newest group to its wait: reading it earlier sees the NaN poison
    assert np.isnan(early[256:]).all()


@cuda.jit
def _cp_async_one_kernel(src, index, valid):
    smem = cuda.shared.array(8, np.float16)
    cp_async_16(smem, 0, src, index, valid)
    cp_async_commit()
    WAIT_ALL()


@pytest.mark.parametrize("index", [-8, 512])
def test_cp_async_refuses_a_valid_copy_outside_its_source(index):
    """A valid copy reads 8 elements of its array (outside it a GPU reads another tensor's bytes or faults; numpy
    would wrap -8 round to the last chunk); a zero-fill copy (valid 0) reads nothing and may point anywhere."""
    src = np.ones(512, np.float16)
    _cp_async_one_kernel[1, 1](src, 504, 1)
    _cp_async_one_kernel[1, 1](src, index, 0)
    with pytest.raises(IndexError, match="outside the array"):
        _cp_async_one_kernel[1, 1](src, index, 1)
