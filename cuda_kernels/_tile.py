"""The GEMM tile: the one piece to replace when a tensor-core MMA is swapped in.

Every matrix kernel (convolution forward / backward-data / backward-weight, and the
linear layers, which are 1x1 convolutions) runs the same main loop: a block computes a
``BM x BN`` tile of ``C = A @ B``; per ``BK`` slice of the reduction it stages
``As[BK, BM]`` and ``Bs[BK, BN]`` (fp16, shapes ``A_TILE`` / ``B_TILE``) in shared memory and calls ``tile_mma``, which
adds ``As[:, rows].T @ Bs[:, cols]`` into the thread's fp32 accumulator ``acc[TM, TN]``.
``tile_row(i)`` / ``tile_col(j)`` say which tile row / column ``acc[i, j]`` holds.

This SIMT tile is the reference (``CudaExecutor(kernels="simt")``) and runs what the
tensor-core kernels (``mma_conv`` / ``mma_dgrad`` / ``mma_wgrad``, chosen in ``mma_ops``)
do not take: grouped convolutions and channel counts that are not multiples of 8.
"""
from numba import cuda

from .registry import SIMULATOR, nbt

f32 = nbt.float32
# The simulator runs one Python thread per CUDA thread (about 30 us per simulated array
# access) and polls them at every syncthreads: it gets 2x2 threads, an 8x8 tile instead of
# 64x64, so the tiny test shapes carry little padding (same code, same 4x4 accumulators per
# thread). The GPU configuration is compiled by the PTX tests and checked against numpy at
# real shapes by benchmarks/gpu/check.py.
TX, TY = (2, 2) if SIMULATOR else (16, 16)   # threads per block: (x, y)
TM, TN = 4, 4                                # accumulators per thread
BM, BN, BK = TY * TM, TX * TN, 16            # block tile (rows, columns, reduction slice)
THREADS_PER_BLOCK = TX * TY
# Shared tile shapes, rows padded by two fp16 (one 4-byte bank): staging with k fastest
# writes one column of BK rows per warp, which would otherwise all hit the same bank.
A_TILE, B_TILE = (BK, BM + 2), (BK, BN + 2)


@cuda.jit(device=True)
def tile_row(i):
    return cuda.threadIdx.y + i * TY


@cuda.jit(device=True)
def tile_col(j):
    # consecutive threads own consecutive columns: coalesced stores along the output row
    return cuda.threadIdx.x + j * TX


@cuda.jit(device=True)
def tile_mma(As, Bs, acc):
    """``acc[i, j] += sum_k As[k, tile_row(i)] * Bs[k, tile_col(j)]`` in fp32."""
    a = cuda.local.array(TM, nbt.float32)
    b = cuda.local.array(TN, nbt.float32)
    for k in range(BK):
        for i in range(TM):
            a[i] = f32(As[k, tile_row(i)])
        for j in range(TN):
            b[j] = f32(Bs[k, tile_col(j)])
        for i in range(TM):
            for j in range(TN):
                acc[i, j] += a[i] * b[j]
