"""The Winograd forward and input gradient of 3x3, stride-1, padding-1 convolutions: F(2x2, 3x3) (Lavin and Gray,
"Fast Algorithms for Convolutional Neural Networks", 2016), NHWC, fp32.

The output is cut into 2x2 tiles; tile ``t`` reads the 4x4 input patch ``d`` around it (zero outside the image)
and its output is ``A^T [sum over input channels of (G g G^T) * (B^T d B)] A``, with ``g`` the 3x3 kernel. The
sum over input channels, for each of the 16 points of the 4x4 transformed tile, is a GEMM: ``M[k] = V[k] @
U[k]`` with ``V[k]`` ``(tiles, Cin)`` the transformed input and ``U[k]`` ``(Cin, Cout)`` the transformed
weight. That is 16 multiply-adds per tile, input and output channel, against 36 for the 2x2 pixels computed
directly: 2.25x fewer, at the price of the transforms (additions, and halving in ``G``). The transforms' entries
are 0, 1, -1 and 1/2, so the rounding error stays that of a float32 sum: on a 256-channel 14x14 layer the largest
distance to the float64 result was 1.8e-6, against 2.1e-6 for a direct float32 sum and 2.8e-6 for im2col + GEMM
(``tests/cpu/test_conv_winograd.py`` holds it to the direct kernels' tolerance). A non-finite input makes the same
outputs non-finite as a direct sum would (each output's terms are those of its 3x3 window), but an infinity may
come out as NaN: the transforms add and subtract it.

Work is split into "bands" (a row of tiles of one sample: 2 output rows), one static range of bands per thread
(``cpu_ref._misc``). A thread transforms a chunk of bands into its own ``V``, runs the 16 GEMMs on a
single-threaded BLAS into its own ``M``, and transforms the chunk's output rows back; the rows of a chunk are
consecutive rows of the output, so an eval epilogue (`cpu_ref._epilogue`) applies to them while they are in
cache, as the other algorithms do. Chunk sizes (`chunk_bands`) follow the BLAS: where OpenBLAS has unpacked
small-matrix kernels, each GEMM stays within them; elsewhere a chunk is large enough that packing ``U[k]``
for every GEMM costs little against the product.

The input gradient of such a layer is the same convolution of ``dy`` with the weight turned by 180 degrees and its
channels swapped. `weight_transform` with ``turned`` computes its transform from ``w`` directly: ``w``'s own, with
points 0 and 3 of each axis swapped, as ``(16, Cout, Cin)``. With ``accumulate`` each chunk is added into ``dx`` from a
per-thread buffer.

The layers that take this algorithm are chosen by `planner.conv_algorithm` (the plan records it); this module
runs whatever it is given, any channel counts and image sizes (odd sizes: the last tile is cut off).
"""
import numpy as np
from numba import njit, prange

from cpu_ref._epilogue import apply_rows
from cpu_ref._misc import partition, run_split

#: Points of the transformed 4x4 tile: one GEMM each.
POINTS = 16
#: Without small-matrix kernels (see `chunk_bands`), a chunk holds about this many tiles: enough that OpenBLAS's
#: packing of ``U[k]`` for each GEMM costs little against the product, few enough that the two threads' ``V`` and
#: ``M`` stay in cache. With OpenBLAS's Haswell kernels at 2 threads, resnet50's 64-, 128- and 256-channel layers
#: (batch 8) took 8.5, 6.7 and 6.6-7.7 ms with chunks of 252, 252 and 196 tiles (im2col + GEMM: 10.9, 9.9 and 9.8);
#: with chunks of one band (28, 14, 7 tiles) 11, 15 and 26 ms; resnet20's 64-channel layer (batch 128, 8x8) 3.5-3.9
#: with 128-256 tiles but 8-9 with 512-1024 (the threads' chunks no longer fit the caches).
PACKED_CHUNK_TILES = 256


def chunk_bands(tiles_per_band, cin, cout, small_macs):
    """Bands per chunk for a layer of ``cin`` -> ``cout`` channels with ``tiles_per_band`` tiles a band. With
    ``small_macs`` (OpenBLAS's small-matrix bound on M*N*K, where its kernel set has them; else 0) each GEMM of
    ``tiles x cin x cout`` stays within it: there, on AVX-512, resnet50's 128- and 256-channel layers took 5.2
    and 5.5 ms with chunks of 56 and 14 tiles against 6.3 and 8.2 with twice as many (packed GEMMs). Otherwise
    chunks hold ``PACKED_CHUNK_TILES``. Never less than one band."""
    tiles = small_macs // (cin * cout) if small_macs else PACKED_CHUNK_TILES
    return max(1, tiles // tiles_per_band)


# ---------------------------------------------------------------------------- the weight transform

#: Output and input channels per block of the weight transform: the block's 16 transformed points (64 KB) stay in
#: cache while they are written out, transposed, as whole cache lines.
WEIGHT_BLOCK = (16, 64)
#: The point the turned kernel's transform puts each point of the kernel's at: turning a 3x3 kernel by 180 degrees
#: swaps the first and last rows of ``G`` (``G J = P G``), so ``G (J g J) G^T = P (G g G^T) P^T`` swaps points 0 and
#: 3 of each axis.
TURNED_POINT = np.array([4 * (3 - r if r in (0, 3) else r) + (3 - s if s in (0, 3) else s)
                         for r in range(4) for s in range(4)])


@njit(cache=True)
def _weight_span(w3, u, point, turned, t, nparts):
    """Partition ``t`` of the (output, input) channel blocks of ``u`` = ``G g G^T`` from the OHWI weight as ``w3``
    ``(Cout, 9, Cin)``: ``u`` is ``(16, Cin, Cout)``, or with ``turned`` the transform of the input gradient's weight
    (the kernel turned by 180 degrees, the channels swapped), ``(16, Cout, Cin)`` with point ``k`` at ``point[k]``.
    Reads ``w3`` and writes ``u`` once, in whole lines; a block's points are transposed through ``blk``. (Element
    indexing throughout, and a constant trip count in the transposing loop: with row views, or a variable count,
    the transform ran 2-3x slower.)"""
    cout, _, cin = w3.shape
    ob, cb = WEIGHT_BLOCK
    nob, ncb = -(-cout // ob), -(-cin // cb)
    lo, hi = partition(nob * ncb, t, nparts)
    blk = np.empty((16, ob, cb), np.float32)
    h = np.float32(0.5)
    for b in range(lo, hi):
        o0, c0 = (b // ncb) * ob, (b % ncb) * cb
        no, nc = min(ob, cout - o0), min(cb, cin - c0)
        for o in range(no):
            for c in range(nc):
                g0, g1, g2 = w3[o0 + o, 0, c0 + c], w3[o0 + o, 1, c0 + c], w3[o0 + o, 2, c0 + c]
                g3, g4, g5 = w3[o0 + o, 3, c0 + c], w3[o0 + o, 4, c0 + c], w3[o0 + o, 5, c0 + c]
                g6, g7, g8 = w3[o0 + o, 6, c0 + c], w3[o0 + o, 7, c0 + c], w3[o0 + o, 8, c0 + c]
                for r in range(4):   # row r of G g (a, e, f), times G^T
                    if r == 0:
                        a, e, f = g0, g1, g2
                    elif r == 1:
                        a, e, f = (g0 + g3 + g6) * h, (g1 + g4 + g7) * h, (g2 + g5 + g8) * h
                    elif r == 2:
                        a, e, f = (g0 - g3 + g6) * h, (g1 - g4 + g7) * h, (g2 - g5 + g8) * h
                    else:
                        a, e, f = g6, g7, g8
                    blk[4 * r, o, c] = a
                    blk[4 * r + 1, o, c] = (a + e + f) * h
                    blk[4 * r + 2, o, c] = (a - e + f) * h
                    blk[4 * r + 3, o, c] = f
        for k in range(16):
            if turned:
                q = point[k]
                if nc == cb:
                    for o in range(no):
                        for c in range(cb):
                            u[q, o0 + o, c0 + c] = blk[k, o, c]
                else:
                    for o in range(no):
                        for c in range(nc):
                            u[q, o0 + o, c0 + c] = blk[k, o, c]
            elif no == ob:
                for c in range(nc):
                    for o in range(ob):
                        u[k, c0 + c, o0 + o] = blk[k, o, c]
            else:
                for c in range(nc):
                    for o in range(no):
                        u[k, c0 + c, o0 + o] = blk[k, o, c]


@njit(cache=True, parallel=True)
def _weight_parallel(w3, u, point, turned, nparts):
    for t in prange(nparts):
        _weight_span(w3, u, point, turned, t, nparts)


def weight_transform(w, turned=False, u=None):
    """``U`` ``(16, Cin, Cout)`` of an OHWI 3x3 weight ``w``: ``G g G^T`` for each (input, output) channel. With
    ``turned``, ``(16, Cout, Cin)``: the same of the input gradient's weight, ``w`` turned by 180 degrees with its
    channels swapped (whose convolution of ``dy``, 3x3, stride 1, padding 1, is the input gradient). Into ``u``
    where given (C-contiguous, of that shape)."""
    cout, _, _, cin = w.shape
    w3 = np.ascontiguousarray(w).reshape(cout, 9, cin)
    shape = (POINTS, cout, cin) if turned else (POINTS, cin, cout)
    if u is None:
        u = np.empty(shape, np.float32)
    elif u.shape != shape or not u.flags.c_contiguous:
        raise ValueError(f"weight_transform: u must be a C-contiguous {shape} array for a {w.shape} weight "
                         f"(turned={turned}); got {u.shape}")
    run_split(_weight_span, _weight_parallel, u.size, w3, u, TURNED_POINT, turned)
    return u


# ---------------------------------------------------------------------------- input and output transforms

@njit(cache=True, inline="always")
def _input_tile(xf, v, r, i, n, ty, tx, h, w, c):
    """``v[:, i]`` = ``B^T d B`` for the 4x4 input patch ``d`` of tile ``(ty, tx)`` of sample ``n`` (zero outside
    the image), vectorised over the ``c`` channels; ``r`` ``(16, c)`` holds ``d B`` row by row. Reads outside the
    image are clamped to an edge pixel and their value replaced by zero (a select, so that a non-finite edge
    pixel does not leak into the padding)."""
    z = np.float32(0.0)
    x0 = 2 * tx - 1
    o0, o1, o2, o3 = max(x0, 0) * c, min(x0 + 1, w - 1) * c, min(x0 + 2, w - 1) * c, min(x0 + 3, w - 1) * c
    in0, in2, in3 = x0 >= 0, x0 + 2 < w, x0 + 3 < w   # column x0 + 1 is always inside
    for a in range(4):
        r0, r1, r2, r3 = r[4 * a], r[4 * a + 1], r[4 * a + 2], r[4 * a + 3]
        yy = 2 * ty - 1 + a
        if yy < 0 or yy >= h:
            for ch in range(c):
                r0[ch] = z
                r1[ch] = z
                r2[ch] = z
                r3[ch] = z
            continue
        row = (n * h + yy) * w * c
        for ch in range(c):
            d0 = xf[row + o0 + ch] if in0 else z
            d1 = xf[row + o1 + ch]
            d2 = xf[row + o2 + ch] if in2 else z
            d3 = xf[row + o3 + ch] if in3 else z
            r0[ch] = d0 - d2
            r1[ch] = d1 + d2
            r2[ch] = d2 - d1
            r3[ch] = d1 - d3
    for b in range(4):
        e0, e1, e2, e3 = r[b], r[4 + b], r[8 + b], r[12 + b]
        v0, v1, v2, v3 = v[b, i], v[4 + b, i], v[8 + b, i], v[12 + b, i]
        for ch in range(c):
            v0[ch] = e0[ch] - e2[ch]
            v1[ch] = e1[ch] + e2[ch]
            v2[ch] = e2[ch] - e1[ch]
            v3[ch] = e1[ch] - e3[ch]


@njit(cache=True, inline="always")
def _output_tile(m, i, ymat, shift, n, ty, tx, h, w, spare):
    """The 2x2 output pixels of tile ``(ty, tx)`` of sample ``n``, ``A^T m[:, i] A``, into rows ``shift`` + their
    pixel index of ``ymat`` (``(rows, Cout)``). A tile cut off by the image's edge (odd sizes) is computed into
    ``spare`` (at least ``(4, Cout)``) and only its pixels inside the image are copied (a bounds test per element
    kept the loop from vectorising: 64-channel layers at odd sizes ran 2-3x slower than the direct kernel)."""
    y0, x0 = 2 * ty, 2 * tx
    wide, tall = x0 + 1 < w, y0 + 1 < h
    p = (n * h + y0) * w + x0 + shift
    a0, a1, a2, a3 = m[0, i], m[1, i], m[2, i], m[3, i]
    a4, a5, a6, a7 = m[4, i], m[5, i], m[6, i], m[7, i]
    a8, a9, a10, a11 = m[8, i], m[9, i], m[10, i], m[11, i]
    a12, a13, a14, a15 = m[12, i], m[13, i], m[14, i], m[15, i]
    whole = wide and tall
    o00 = ymat[p] if whole else spare[0]
    o01 = ymat[p + 1] if whole else spare[1]
    o10 = ymat[p + w] if whole else spare[2]
    o11 = ymat[p + w + 1] if whole else spare[3]
    for k in range(a0.size):
        s1, s2 = a1[k] + a5[k] + a9[k], a2[k] + a6[k] + a10[k]
        q1, q2 = a5[k] - a9[k] - a13[k], a6[k] - a10[k] - a14[k]
        o00[k] = (a0[k] + a4[k] + a8[k]) + s1 + s2
        o01[k] = s1 - s2 - (a3[k] + a7[k] + a11[k])
        o10[k] = (a4[k] - a8[k] - a12[k]) + q1 + q2
        o11[k] = q1 - q2 - (a7[k] - a11[k] - a15[k])
    if whole:
        return
    ymat[p] = o00[:a0.size]
    if wide:
        ymat[p + 1] = o01[:a0.size]
    if tall:
        ymat[p + w] = o10[:a0.size]


@njit(cache=True, inline="always")
def _band_row(b, th, h, w):
    """The first output row (pixel index) of band ``b``; band ``n * th`` starts sample ``n``."""
    n = b // th
    return (n * h + min(2 * (b - n * th), h)) * w


# ---------------------------------------------------------------------------- the convolution: forward or input gradient

@njit(cache=True)
def winograd_span(x, u, ymat, v, m, r, acc, bands, ep_scale, ep_shift, ep_residual, ep_relu, ep_out, ep_scratch, t,
                  nparts):
    """Partition ``t`` of the bands, ``bands`` at a time: ``x`` ``(N, H, W, Cin)``, ``u`` ``(16, Cin, Cout)``
    (`weight_transform`), ``ymat`` the output as ``(N*H*W, Cout)``; ``v``, ``m``, ``r``: this partition's
    ``(16, tiles, Cin)``, ``(16, tiles, Cout)`` and ``(16, max(Cin, Cout))`` workspaces (``v[t]`` ...
    of the caller's; ``r`` holds the input transform's rows and a cut-off tile's outputs).
    With ``acc`` ``(nparts, rows, Cout)`` (not empty: the input gradient's ``accumulate``), each chunk goes to
    ``acc[t]`` and is added into its rows of ``ymat``. With an epilogue (``ep_*``, as in
    `cpu_ref._conv._gemm_span`), each chunk's rows go to ``ep_out`` through their own rows of ``ymat``, or with
    ``ep_scratch`` through the partition's first rows."""
    n_, h, w, c = x.shape
    th, tw = (h + 1) // 2, (w + 1) // 2
    lo, hi = partition(n_ * th, t, nparts)
    xf = x.reshape(-1)
    vt, mt, rt = v[t], m[t], r[t]
    part_row = _band_row(lo, th, h, w)
    for b0 in range(lo, hi, bands):
        b1 = min(hi, b0 + bands)
        tiles = (b1 - b0) * tw
        i = 0
        for b in range(b0, b1):
            n = b // th
            for tx in range(tw):
                _input_tile(xf, vt, rt, i, n, b - n * th, tx, h, w, c)
                i += 1
        for k in range(POINTS):
            np.dot(vt[k, :tiles], u[k], mt[k, :tiles])
        c0, c1 = _band_row(b0, th, h, w), _band_row(b1, th, h, w)
        dst, shift = ymat, (part_row if ep_scratch else c0) - c0
        if acc.shape[0] > 0:
            dst, shift = acc[t], -c0
        i = 0
        for b in range(b0, b1):
            n = b // th
            for tx in range(tw):
                _output_tile(mt, i, dst, shift, n, b - n * th, tx, h, w, rt)
                i += 1
        if acc.shape[0] > 0:
            for row in range(c1 - c0):
                o, a = ymat[c0 + row], dst[row]
                for k in range(o.size):
                    o[k] += a[k]
        elif ep_out.shape[0] > 0:
            apply_rows(ymat, c0 + shift, ep_out, c0, c1, ep_scale, ep_shift, ep_residual, ep_relu)


@njit(cache=True, parallel=True)
def winograd_parallel(x, u, ymat, v, m, r, acc, bands, ep_scale, ep_shift, ep_residual, ep_relu, ep_out, ep_scratch,
                      nparts):
    for t in prange(nparts):
        winograd_span(x, u, ymat, v, m, r, acc, bands, ep_scale, ep_shift, ep_residual, ep_relu, ep_out, ep_scratch,
                      t, nparts)
