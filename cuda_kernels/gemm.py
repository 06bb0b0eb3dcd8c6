"""The implicit-GEMM main loop shared by the convolution and linear kernels.

``make_mainloop(load_a, load_b, a_k_fastest, b_k_fastest)`` builds a device function
that accumulates one block's ``BM x BN`` tile of ``C = A @ B`` over the reduction range
``[k_begin, k_end)`` into the thread's ``acc[TM, TN]``, staging the tiles in shared memory it allocates
itself. ``load_a(a, geo, g, m, k)`` and ``load_b(b, geo, g, k, n)`` read one
fp16 element of the implicit operands (zero outside the input: the padding of a
convolution); the ``*_k_fastest`` flags choose which index consecutive threads walk
while staging a tile, so that global loads are coalesced along the contiguous axis.

Geometry is one int32 tuple (``CONV_GEOMETRY``) with the fields ``GEOMETRY_FIELDS``;
``g`` is the group (``blockIdx.z % groups``), the rest of ``blockIdx.z`` splits the
reduction (used by the weight gradient).
"""
import math

from numba import cuda

from .registry import ZERO, geometry, int32_tuple, nbt

f16 = nbt.float16
from ._tile import A_TILE, B_TILE, BK, BM, BN, THREADS_PER_BLOCK, TM, TN, TX, TY, tile_mma

GEOMETRY_FIELDS = ("gemm_m", "gemm_n", "gemm_k", "batch", "h", "w", "c_in", "oh", "ow", "c_out",
                   "kh", "kw", "stride", "pad", "groups", "k_chunk", "accumulate")
CONV_GEOMETRY = geometry(len(GEOMETRY_FIELDS))
BLOCK = (TX, TY)


def make_geometry(**fields):
    missing = set(GEOMETRY_FIELDS) - set(fields)
    if missing:
        raise ValueError(f"make_geometry: missing fields {sorted(missing)}")
    return int32_tuple(*(fields[f] for f in GEOMETRY_FIELDS))


def gemm_grid(m, n, groups, splits=1):
    return (math.ceil(m / BM), math.ceil(n / BN), groups * splits)


def make_mainloop(load_a, load_b, a_k_fastest, b_k_fastest):
    @cuda.jit(device=True)
    def mainloop(a, b, geo, g, m0, n0, k_begin, k_end, acc):
        As = cuda.shared.array(A_TILE, nbt.float16)
        Bs = cuda.shared.array(B_TILE, nbt.float16)
        gemm_m, gemm_n = geo[0], geo[1]
        tid = cuda.threadIdx.y * TX + cuda.threadIdx.x
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = ZERO
        for k0 in range(k_begin, k_end, BK):
            for e in range(tid, BM * BK, THREADS_PER_BLOCK):
                if a_k_fastest:
                    kk, mm = e % BK, e // BK
                else:
                    kk, mm = e // BM, e % BM
                m, k = m0 + mm, k0 + kk
                As[kk, mm] = load_a(a, geo, g, m, k) if (m < gemm_m and k < k_end) else f16(ZERO)
            for e in range(tid, BN * BK, THREADS_PER_BLOCK):
                if b_k_fastest:
                    kk, nn = e % BK, e // BK
                else:
                    kk, nn = e // BN, e % BN
                n, k = n0 + nn, k0 + kk
                Bs[kk, nn] = load_b(b, geo, g, k, n) if (n < gemm_n and k < k_end) else f16(ZERO)
            cuda.syncthreads()
            tile_mma(As, Bs, acc)
            cuda.syncthreads()
    return mainloop
