"""Direct NHWC convolution forward for the layers where im2col + GEMM loses.

im2col copies every input pixel ``KH*KW`` times to hand BLAS one big matrix; for a layer with few
input channels (the 3-channel stem: 27 columns) or a strided one (each input pixel still copied
into several patches, for a quarter of the outputs) the copy and the packing of the thin matrix
cost more than the multiply-adds. Here a block of ``PIXELS`` output pixels of one output row,
all ``Cout`` channels, stays in vector registers (`cpu_ref._simd`: output channels in the lanes)
while the kernel walks the taps and input channels: each input value is one broadcast
multiply-add per pixel and each weight vector is loaded once per block. Pixels whose window
leaves the image (the borders) are done one at a time over their valid taps.

The choice is a rule of the shapes (`uses_direct_forward`), never a timing, so results do not
depend on the machine's load. Output rows are split between threads; every output element is
computed by one thread in one fixed order, so the result does not depend on the thread count.
"""
import functools

import numpy as np
from numba import njit, prange, uint64

from cpu_ref._misc import partition, run_split
from cpu_ref._simd import vector_block

#: Floats of output block in registers: 4 zmm on AVX-512, 8 of AVX2's 16 ymm.
BLOCK_FLOATS = 64
#: Input channels x taps below which the im2col row is too short for BLAS to gain (the stem's 27).
DIRECT_MAX_PATCH = 32
#: Output pixels a block must hold for the direct forward to be chosen: with one, every weight vector
#: is loaded for a single pixel, and 64-channel layers ran slower than im2col + GEMM.
MIN_BLOCK_PIXELS = 2


def uses_direct_forward(w_shape, stride, groups) -> bool:
    """The layers the direct forward takes: ungrouped, a window wider than 1x1, output channels in whole
    8-float vectors with room for ``MIN_BLOCK_PIXELS`` pixels per block, and either a short patch (the
    stem) or a stride."""
    cout, kh, kw, cin = w_shape
    return (groups == 1 and kh * kw > 1 and cout % 8 == 0 and cout * MIN_BLOCK_PIXELS <= BLOCK_FLOATS
            and (kh * kw * cin <= DIRECT_MAX_PATCH or stride > 1))


@functools.cache
def _kernels(cout):
    pixels = max(1, BLOCK_FLOATS // cout)
    alloc, zero, fma, store = vector_block(cout, pixels)

    @njit
    def span(x, wk, y, s, p, t, nparts):
        """Output rows ``r = n*OH + oh`` of partition ``t``; ``wk`` is the weight as ``(KH, KW, Cin, Cout)``."""
        n_, h, w, c = x.shape
        kh, kw = wk.shape[0], wk.shape[1]
        _, oh_, ow_, _ = y.shape
        xf, wf, yf = x.reshape(-1), wk.reshape(-1), y.reshape(-1)
        block = alloc()
        inner_lo = (p + s - 1) // s                            # first output column whose window is inside
        inner_hi = max(inner_lo, min(ow_, (w - kw + p) // s + 1))
        r0, r1 = partition(n_ * oh_, t, nparts)
        for r in range(r0, r1):
            n, oh = r // oh_, r % oh_
            y_row = uint64(r * ow_ * cout)
            ow = 0
            while ow < ow_:
                whole = inner_lo <= ow and ow + pixels <= inner_hi
                for q in range(pixels):
                    zero(block, q)
                for i in range(kh):
                    ih = oh * s - p + i
                    if ih < 0 or ih >= h:
                        continue
                    for j in range(kw):
                        w_tap = uint64((i * kw + j) * c * cout)
                        if whole:
                            x_tap = uint64(((n * h + ih) * w + ow * s - p + j) * c)
                            for ci in range(uint64(c)):
                                wi = w_tap + ci * uint64(cout)
                                for q in range(pixels):
                                    fma(block, q, xf[x_tap + uint64(q * s * c) + ci], wf, wi)
                        else:
                            iw = ow * s - p + j
                            if iw < 0 or iw >= w:
                                continue
                            x_tap = uint64(((n * h + ih) * w + iw) * c)
                            for ci in range(uint64(c)):
                                fma(block, 0, xf[x_tap + ci], wf, w_tap + ci * uint64(cout))
                done = pixels if whole else 1
                for q in range(pixels):
                    if q < done:
                        store(block, q, yf, y_row + uint64((ow + q) * cout))
                ow += done

    @njit(parallel=True)
    def parallel(x, wk, y, s, p, nparts):
        for t in prange(nparts):
            span(x, wk, y, s, p, t, nparts)

    return span, parallel


def direct_forward(x, w, y, stride, pad, work):
    """``y = conv2d(x, w)`` (groups 1) for a layer `uses_direct_forward` takes; no workspace. ``work``:
    its size in elementwise units, for `run_split`'s choice of the thread pool."""
    span, parallel = _kernels(w.shape[0])
    run_split(span, parallel, work, x, np.ascontiguousarray(w.transpose(1, 2, 3, 0)), y, stride, pad)
