"""conv2d forward and backward (NHWC activations, OHWI weights, fp32).

Five algorithms, chosen from the shapes by a rule the plan records per layer (`planner.conv_algorithm`):
- general: im2col of a chunk of output rows into the worker's slice of ``col``, then one
  BLAS GEMM per chunk (and group). A chunk is sized to stay in L2, so the im2col matrix
  never makes a round trip through memory, and smaller still where OpenBLAS has unpacked
  kernels for small GEMMs (``SMALL_GEMM_MACS``). Forward and backward walk the chunks with the
  same loop (``_gemm_span``); per chunk the forward does ``y = col @ W.T``, the backward
  ``dW.T += col.T @ dy`` and ``dcol = dy @ W``, scattered back by col2im.
- pointwise (1x1, stride 1, pad 0, groups 1): the input *is* the matrix; no workspace.
- depthwise (groups == Cin == Cout): a direct loop, vectorised over channels; no workspace.
- winograd (`cpu_ref._conv_winograd`, forward and input gradient): F(2x2, 3x3) for 3x3 stride-1 padding-1 layers,
  16 GEMMs over transformed tiles, per chunk of output rows in per-thread workspaces; a layer whose input gradient
  is Winograd's takes its weight gradient from an im2col + GEMM pass of its own.
- direct (`cpu_ref._conv_direct`): register-blocked loops without workspace for the narrow 3x3 (and
  wider) layers: the forward of those with 8, 16 or 32 output channels (64 with AVX-512), the input gradient
  of those with as many input channels, the weight gradient where the input gradient is direct too
  (or not wanted: otherwise one GEMM pass does both).

Parallelism (``cpu_ref._misc``): the work is split into one static partition per thread;
small convolutions run the partitions one after another, larger ones on the thread pool
(``prange``). Either way every GEMM runs on a single-threaded BLAS
(numba's ``np.dot`` uses SciPy's BLAS; several threads calling a multi-threaded OpenBLAS at
once serialise badly, and a second thread pool spinning next to numba's costs more than it
gives), so the wrappers pin it to one thread for the duration of a call (``cpu_ref._blas``:
reference-counted across Python threads). The backward pass
partitions by *sample*, so that the col2im scatter of two workers never touches the same
``dx`` element, and sums per-worker weight gradients in a fixed order: results are
deterministic for a given thread count.
"""
import contextlib

import numba
import numpy as np
from numba import njit, prange, uint64

from cpu_ref._blas import BLAS_CORE, BLAS_THREADS, one_blas_thread
from cpu_ref._conv_direct import direct_forward, direct_input_grad, direct_weight_grad
from cpu_ref._conv_winograd import POINTS, chunk_bands, weight_transform, winograd_parallel, winograd_span
from cpu_ref._epilogue import NONE, apply_rows
from cpu_ref._misc import partition, partitions, run_partitioned, run_split, window
from cpu_ref._workspace import workspace
from planner.conv_algorithm import conv_algorithms

#: Bytes of im2col matrix a worker fills per GEMM: about one L2, so the GEMM reads it from cache.
COL_CHUNK_BYTES = 1 << 19
#: ... but never fewer rows than this: OpenBLAS packs the weight operand (``KD x Cout``) afresh in every
#: call, and an L2-sized chunk of a wide layer has few rows (28 for 512 channels 3x3), so the packing took
#: as long as the product. resnet50's 3x3 layers (batch 8, one thread) ran 1.4-1.9x PyTorch's forward with
#: L2-sized chunks, 1.15-1.25x with at least 256-512 rows. The workspace holds every row, so any chunk fits.
MIN_GEMM_ROWS = 512
#: OpenBLAS (0.3.16 on) multiplies a GEMM of at most this many multiply-adds with its "small
#: matrix" kernels, which skip packing the operands (``sgemm_small_kernel_permit_*.c``); only some
#: kernel sets have them. Where the BLAS has them, a chunk is cut to fit: the GEMMs of 16- and
#: 32-channel 3x3 convolutions then ran 1.3-2.4x faster (README, "CPU performance"). Elsewhere (the
#: Haswell and Zen kernels of AVX2 machines) small chunks only add calls, and at 64 channels (27
#: rows) made the GEMMs slower, so chunks stay L2-sized there.
SMALL_GEMM_MACS = 1_000_000
#: The OpenBLAS kernel sets (``BLAS_CORE``) with small-matrix SGEMM kernels on x86-64: SkylakeX's, which
#: Cooperlake's and SapphireRapids' include.
SMALL_GEMM_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})
#: Below this many rows per chunk, the chunk's own costs (a call per GEMM, adding its ``KD x Cout``
#: weight gradient) ate the gain: 64-channel 3x3 layers (27 or 54 rows) were no faster. They stay L2-sized.
MIN_SMALL_GEMM_ROWS = 64
#: Multiply-adds a GEMM does in the time an elementwise kernel handles one element: converts
#: a convolution's work into the element count the parallel threshold is stated in.
MACS_PER_ELEMENT = 16


def _gemm_partitions(units):
    """Partition count for a GEMM kernel over ``units`` rows or samples, and the context its
    BLAS calls must run in."""
    if BLAS_THREADS is None:  # cannot pin BLAS threads: one partition, BLAS parallelises itself
        return 1, contextlib.nullcontext()
    return partitions(units), one_blas_thread()


def _small_gemm_macs():
    """``SMALL_GEMM_MACS`` where the BLAS's kernel set has small-matrix kernels, else 0."""
    return SMALL_GEMM_MACS if BLAS_CORE in SMALL_GEMM_CORES else 0


def _chunk_rows(rows_per_worker, row_len):
    return max(1, min(rows_per_worker, max(MIN_GEMM_ROWS, COL_CHUNK_BYTES // (4 * row_len))))


def _gemm_chunk_rows(rows_per_worker, kd, kg):
    """``(rows, small)``: rows of im2col matrix per GEMM of the general algorithm (``kd`` columns,
    ``kg`` output channels per group), and whether its GEMMs fit OpenBLAS's unpacked small-matrix
    kernels (where it has them; otherwise chunks are L2-sized)."""
    rows = _chunk_rows(rows_per_worker, kd)
    small_macs = _small_gemm_macs()
    small_rows = small_macs // (kd * kg)
    if small_macs and small_rows >= MIN_SMALL_GEMM_ROWS:
        return min(rows, small_rows), True
    return rows, False


def conv_output_size(size, k, stride, pad):
    return (size + 2 * pad - k) // stride + 1


# ---------------------------------------------------------------------------- im2col / col2im
# The copy loops are written out inline with unsigned indices, and the output pixel is
# advanced by counting rather than divided out of the row index: a call per copy, a signed
# index (numba's negative-index wraparound check) or three integer divisions per row each
# cost more than copying the 48 floats of a 3x3x16 patch row.

@njit(cache=True, inline="always")
def _next_pixel(n, oh, ow, oh_, ow_, advance):
    """``(n, oh, ow)`` of the next im2col row when ``advance``, else unchanged."""
    if not advance:
        return n, oh, ow
    ow += 1
    if ow == ow_:
        ow = 0
        oh += 1
        if oh == oh_:
            oh = 0
            n += 1
    return n, oh, ow


@njit(cache=True)
def _im2col_rows(xf, h, w, c, colf, r0, r1, c0, cg, oh_, ow_, kh, kw, s, p):
    """Rows ``[r0, r1)`` of the im2col matrix of channels ``[c0, c0+cg)`` into ``colf[0:]``.

    Row ``r = (n*OH + oh)*OW + ow``, column ``(i*KW + j)*cg + c`` (the OHWI weight order).
    """
    kd = kh * kw * cg
    zero = np.float32(0.0)
    n, oh, ow = r0 // (oh_ * ow_), (r0 // ow_) % oh_, r0 % ow_
    for r in range(r0, r1):
        n, oh, ow = _next_pixel(n, oh, ow, oh_, ow_, r > r0)
        iw0 = ow * s - p
        jlo = max(0, -iw0)
        jhi = max(jlo, min(kw, w - iw0))
        for i in range(kh):
            ih = oh * s - p + i
            dst = uint64((r - r0) * kd + i * kw * cg)
            if ih < 0 or ih >= h:
                for e in range(uint64(kw * cg)):
                    colf[dst + e] = zero
                continue
            for e in range(uint64(jlo * cg)):
                colf[dst + e] = zero
            src = uint64(((n * h + ih) * w + iw0 + jlo) * c + c0)
            if cg == c:
                d = dst + uint64(jlo * cg)
                for e in range(uint64((jhi - jlo) * c)):
                    colf[d + e] = xf[src + e]
            else:
                for j in range(jhi - jlo):
                    d, sj = dst + uint64((jlo + j) * cg), src + uint64(j * c)
                    for e in range(uint64(cg)):
                        colf[d + e] = xf[sj + e]
            for e in range(uint64(jhi * cg), uint64(kw * cg)):
                colf[dst + e] = zero


@njit(cache=True)
def _col2im_rows(colf, dxf, h, w, c, r0, r1, c0, cg, oh_, ow_, kh, kw, s, p):
    """Adjoint of ``_im2col_rows``: add the rows' patch gradients into ``dxf``."""
    kd = kh * kw * cg
    n, oh, ow = r0 // (oh_ * ow_), (r0 // ow_) % oh_, r0 % ow_
    for r in range(r0, r1):
        n, oh, ow = _next_pixel(n, oh, ow, oh_, ow_, r > r0)
        iw0 = ow * s - p
        jlo = max(0, -iw0)
        jhi = max(jlo, min(kw, w - iw0))
        for i in range(kh):
            ih = oh * s - p + i
            if ih < 0 or ih >= h:
                continue
            src = uint64((r - r0) * kd + i * kw * cg + jlo * cg)
            dst = uint64(((n * h + ih) * w + iw0 + jlo) * c + c0)
            if cg == c:
                for e in range(uint64((jhi - jlo) * c)):
                    dxf[dst + e] += colf[src + e]
            else:
                for j in range(jhi - jlo):
                    d, sj = dst + uint64(j * c), src + uint64(j * cg)
                    for e in range(uint64(cg)):
                        dxf[d + e] += colf[sj + e]


# ---------------------------------------------------------------------------- general: im2col + GEMM

@njit(cache=True)
def _gemm_span(x, w2d, wt_groups, ymat, dx, dwt_parts, s, p, kh, kw, colf, chunk, backward, want_dx, accumulate,
               ep_scale, ep_shift, ep_residual, ep_relu, ep_out, ep_scratch, t, nparts):
    """Partition ``t`` of the output rows (forward) or of the samples (backward), chunk by
    chunk in its own ``chunk*KD`` slice of ``colf``. With small-matrix chunks, ``wt_groups[g]`` is
    group ``g``'s weight transposed, ``(KD, Cout/groups)`` and C-contiguous (a transposed view keeps
    OpenBLAS's unpacked kernels out of the forward GEMM); otherwise it is empty and the forward
    multiplies by the transposed view, which the packed kernels take as fast (or faster).

    Forward: writes ``ymat`` (the output as ``(rows, Cout)``), or with an epilogue (``ep_*``: the fields of
    `cpu_ref._epilogue.Epilogue`; ``ep_out`` empty for none; groups 1 only) multiplies each chunk into its rows
    of ``ymat`` (or, with ``ep_scratch``, into the partition's first rows, reused chunk after chunk while they
    stay in cache) and writes the epilogue's result to ``ep_out``. Backward: reads ``ymat`` as
    ``dy``, adds the rows' weight gradient into ``dwt_parts[t]`` (``(KD, Cout)``: dW
    transposed, as ``col.T @ dy`` is the faster GEMM) and, when ``want_dx``, writes (or with
    ``accumulate`` adds into) ``dx`` of its samples.
    """
    n_, h, w, c = x.shape
    oh_, ow_ = (h + 2 * p - kh) // s + 1, (w + 2 * p - kw) // s + 1
    cout, kd = w2d.shape
    cg = kd // (kh * kw)
    groups = c // cg
    kg = cout // groups
    rows_per_unit = oh_ * ow_ if backward else 1
    lo, hi = partition(ymat.shape[0] // rows_per_unit, t, nparts)
    r0, r1 = lo * rows_per_unit, hi * rows_per_unit
    xf = x.reshape(-1)
    cw = colf[t * chunk * kd:(t + 1) * chunk * kd]
    cmat = cw.reshape(chunk, kd)
    group_rows = np.empty((chunk if groups > 1 else 0, kg), np.float32)   # a group's columns of y / dy
    dwt_group = np.empty((kd if backward else 0, kg), np.float32)
    dwt = dwt_parts[t]
    dxf = dx.reshape(-1)
    if backward and want_dx and not accumulate:
        for e in range(lo * h * w * c, hi * h * w * c):
            dxf[e] = 0.0
    for c0 in range(r0, r1, chunk):
        c1 = min(r1, c0 + chunk)
        m = c1 - c0
        for g in range(groups):
            _im2col_rows(xf, h, w, c, cw, c0, c1, g * cg, cg, oh_, ow_, kh, kw, s, p)
            wg = w2d[g * kg:(g + 1) * kg]
            src = r0 if ep_scratch else c0
            rows = ymat[src:src + m] if groups == 1 else group_rows[:m]
            if not backward:
                if wt_groups.shape[0] > 0:
                    np.dot(cmat[:m], wt_groups[g], rows)
                else:
                    np.dot(cmat[:m], wg.T, rows)
                if groups > 1:
                    for r in range(m):
                        for o in range(kg):
                            ymat[c0 + r, g * kg + o] = rows[r, o]
                elif ep_out.shape[0] > 0:
                    apply_rows(ymat, src, ep_out, c0, c1, ep_scale, ep_shift, ep_residual, ep_relu)
                continue
            if groups > 1:
                for r in range(m):
                    for o in range(kg):
                        rows[r, o] = ymat[c0 + r, g * kg + o]
            np.dot(cmat[:m].T, rows, dwt_group)
            for i in range(kd):
                for o in range(kg):
                    dwt[i, g * kg + o] += dwt_group[i, o]
            if want_dx:
                np.dot(rows, wg, cmat[:m])
                _col2im_rows(cw, dxf, h, w, c, c0, c1, g * cg, cg, oh_, ow_, kh, kw, s, p)


@njit(cache=True, parallel=True)
def _gemm_parallel(x, w2d, wt_groups, ymat, dx, dwt_parts, s, p, kh, kw, colf, chunk, backward, want_dx, accumulate,
                   ep_scale, ep_shift, ep_residual, ep_relu, ep_out, ep_scratch, nparts):
    for t in prange(nparts):
        _gemm_span(x, w2d, wt_groups, ymat, dx, dwt_parts, s, p, kh, kw, colf, chunk, backward, want_dx, accumulate,
                   ep_scale, ep_shift, ep_residual, ep_relu, ep_out, ep_scratch, t, nparts)


# ---------------------------------------------------------------------------- pointwise: the input is the matrix

@njit(cache=True)
def _pointwise_span(x2d, w2d, ymat, dx2d, dw_parts, chunk, backward, want_dx, accumulate, ep_scale,
                    ep_shift, ep_residual, ep_relu, ep_out, ep_scratch, t, nparts):
    """Partition ``t`` of the rows. Forward: ``y = x @ W.T``, ``chunk`` rows per GEMM, with or without an
    epilogue (as in `_gemm_span`). Backward: ``dw_parts[t] = dy.T @ x`` and ``dx = dy @ W``
    (``accumulate``: added, through a ``chunk``-row buffer)."""
    r0, r1 = partition(x2d.shape[0], t, nparts)
    if r1 == r0:
        return
    if not backward:
        for c0 in range(r0, r1, chunk):
            c1 = min(r1, c0 + chunk)
            src = r0 if ep_scratch else c0
            np.dot(x2d[c0:c1], w2d.T, ymat[src:src + c1 - c0])
            if ep_out.shape[0] > 0:
                apply_rows(ymat, src, ep_out, c0, c1, ep_scale, ep_shift, ep_residual, ep_relu)
        return
    np.dot(ymat[r0:r1].T, x2d[r0:r1], dw_parts[t])
    if not want_dx:
        return
    if not accumulate:
        np.dot(ymat[r0:r1], w2d, dx2d[r0:r1])
        return
    tmp = np.empty((chunk, dx2d.shape[1]), np.float32)
    for c0 in range(r0, r1, chunk):
        c1 = min(r1, c0 + chunk)
        np.dot(ymat[c0:c1], w2d, tmp[:c1 - c0])
        for r in range(c1 - c0):
            for i in range(dx2d.shape[1]):
                dx2d[c0 + r, i] += tmp[r, i]


@njit(cache=True, parallel=True)
def _pointwise_parallel(x2d, w2d, ymat, dx2d, dw_parts, chunk, backward, want_dx, accumulate, ep_scale,
                        ep_shift, ep_residual, ep_relu, ep_out, ep_scratch, nparts):
    for t in prange(nparts):
        _pointwise_span(x2d, w2d, ymat, dx2d, dw_parts, chunk, backward, want_dx, accumulate, ep_scale,
                        ep_shift, ep_residual, ep_relu, ep_out, ep_scratch, t, nparts)


# ---------------------------------------------------------------------------- depthwise: a direct loop

@njit(cache=True)
def _depthwise_forward_span(x, wt, y, s, p, t, nparts):
    """Partition ``t`` of the output rows ``r = n*OH + oh``; ``wt`` is the weight as ``(KH, KW, C)``."""
    _, h, w, c = x.shape
    n_, oh_, ow_, _ = y.shape
    kh, kw, _ = wt.shape
    r0, r1 = partition(n_ * oh_, t, nparts)
    for r in range(r0, r1):
        n, oh = r // oh_, r % oh_
        ilo, ihi = window(oh, kh, s, p, h)
        for ow in range(ow_):
            jlo, jhi = window(ow, kw, s, p, w)
            out = y[n, oh, ow]
            out[:] = 0.0
            for i in range(ilo, ihi):
                for j in range(jlo, jhi):
                    xin = x[n, oh * s - p + i, ow * s - p + j]
                    wij = wt[i, j]
                    for ch in range(c):
                        out[ch] += xin[ch] * wij[ch]


@njit(cache=True, parallel=True)
def _depthwise_forward_parallel(x, wt, y, s, p, nparts):
    for t in prange(nparts):
        _depthwise_forward_span(x, wt, y, s, p, t, nparts)


@njit(cache=True)
def _depthwise_backward_span(x, wt, dy, dx, dwt_parts, s, p, want_dx, accumulate, t, nparts):
    """Partition ``t`` of the samples: their weight gradient into ``dwt_parts[t]``, their ``dx``."""
    n_, h, w, c = x.shape
    _, oh_, ow_, _ = dy.shape
    kh, kw, _ = wt.shape
    lo, hi = partition(n_, t, nparts)
    dwt = dwt_parts[t]
    if want_dx and not accumulate:
        dx[lo:hi] = 0.0
    for n in range(lo, hi):
        for oh in range(oh_):
            ilo, ihi = window(oh, kh, s, p, h)
            for ow in range(ow_):
                jlo, jhi = window(ow, kw, s, p, w)
                g = dy[n, oh, ow]
                for i in range(ilo, ihi):
                    for j in range(jlo, jhi):
                        ih, iw = oh * s - p + i, ow * s - p + j
                        xin = x[n, ih, iw]
                        dwij = dwt[i, j]
                        for ch in range(c):
                            dwij[ch] += g[ch] * xin[ch]
                        if want_dx:
                            dxin = dx[n, ih, iw]
                            wij = wt[i, j]
                            for ch in range(c):
                                dxin[ch] += g[ch] * wij[ch]


@njit(cache=True, parallel=True)
def _depthwise_backward_parallel(x, wt, dy, dx, dwt_parts, s, p, want_dx, accumulate, nparts):
    for t in prange(nparts):
        _depthwise_backward_span(x, wt, dy, dx, dwt_parts, s, p, want_dx, accumulate, t, nparts)


# ---------------------------------------------------------------------------- the contract's entry points

def _col_flat(col, x, w, stride, pad, groups):
    n, h, wd, c = x.shape
    _, kh, kw, cg = w.shape
    need = n * conv_output_size(h, kh, stride, pad) * conv_output_size(wd, kw, stride, pad) * kh * kw * cg
    if col is None or col.size < need:
        raise ValueError(f"conv2d: the im2col workspace needs {need} float32 elements; "
                         f"got {0 if col is None else col.size}")
    return col.reshape(-1)


# stand for a missing dx, so that a kernel compiles one signature, not one with dx and one with None
_NO_DX = np.zeros((0, 0, 0, 0), np.float32)
_NO_DX_2D = np.zeros((0, 0), np.float32)
_NO_WT = np.zeros((0, 0, 0), np.float32)


def _depthwise_weight(w):
    return np.ascontiguousarray(w[:, :, :, 0].transpose(1, 2, 0))


def _run_gemm(x, w, ymat, dx, stride, pad, col, backward, accumulate, epilogue=NONE):
    """The general algorithm, forward (with an `Epilogue`, or `NONE`) or backward; returns dW transposed
    ``(KD, Cout)`` when ``backward``."""
    cout, kh, kw, cg = w.shape
    kd = kh * kw * cg
    groups = x.shape[3] // cg
    colf = _col_flat(col, x, w, stride, pad, groups)
    rows = ymat.shape[0]
    nparts, blas_context = _gemm_partitions(x.shape[0] if backward else rows)
    chunk, small = _gemm_chunk_rows(rows // nparts, kd, cout // groups)
    dwt_parts = np.zeros((nparts, kd if backward else 0, cout), np.float32)
    w2d = w.reshape(cout, kd)
    wt_groups = (np.ascontiguousarray(w2d.reshape(groups, cout // groups, kd).transpose(0, 2, 1))
                 if small and not backward else _NO_WT)
    want_dx = dx is not None
    with blas_context:
        run_partitioned(_gemm_span, _gemm_parallel, nparts, rows * kd * cout // MACS_PER_ELEMENT, x,
                        w2d, wt_groups, ymat, dx if want_dx else _NO_DX, dwt_parts, stride, pad, kh, kw, colf,
                        chunk, backward, want_dx, accumulate, *epilogue)
    return dwt_parts.sum(axis=0) if backward else None


def _run_pointwise(x, w, ymat, dx, backward, accumulate, epilogue=NONE):
    """Forward (with an `Epilogue`, or `NONE`) or backward of the pointwise case; returns dW ``(Cout, Cin)``
    when ``backward``. The forward multiplies L2-sized chunks of rows, so that an epilogue reads them from cache."""
    cout, cin = w.shape[0], x.shape[3]
    x2d = x.reshape(-1, cin)
    rows = x2d.shape[0]
    nparts, blas_context = _gemm_partitions(rows)
    chunk = _chunk_rows(rows, cin) if backward else _chunk_rows(rows // nparts, max(cin, cout))
    dw_parts = np.zeros((nparts, cout if backward else 0, cin), np.float32)
    want_dx = dx is not None
    with blas_context:
        run_partitioned(_pointwise_span, _pointwise_parallel, nparts, rows * cin * cout // MACS_PER_ELEMENT, x2d,
                        w.reshape(cout, cin), ymat, dx.reshape(-1, cin) if want_dx else _NO_DX_2D, dw_parts,
                        chunk, backward, want_dx, accumulate, *epilogue)
    return dw_parts.sum(axis=0) if backward else None


def _run_winograd(x, w, ymat, epilogue=NONE, accumulate=False, turned=False):
    """Winograd's F(2x2, 3x3) (3x3, stride 1, padding 1, groups 1) of ``x`` by ``w`` into ``ymat``, with an
    `Epilogue` or `NONE`, or added into ``ymat`` (``accumulate``); with ``turned``, by the input gradient's weight
    (``w`` turned by 180 degrees, its channels swapped: ``x`` is then ``dy``). Its workspaces (the transformed weight,
    and per partition a chunk of transformed input and output tiles) are its own, kept between calls
    (`cpu_ref._workspace`)."""
    n, h, wd, cin = x.shape
    cout = w.shape[3] if turned else w.shape[0]
    th, tw = (h + 1) // 2, (wd + 1) // 2
    nparts, blas_context = _gemm_partitions(n * th)
    bands = min(chunk_bands(tw, cin, cout, _small_gemm_macs()), -(-n * th // nparts))
    u = weight_transform(w, turned, workspace("winograd u", (POINTS, cin, cout)))   # x's channels in, ymat's out
    slab = bands * tw + 1   # rows per point; one spare, so that the 16 points' rows never lie a power of 2 apart
    v = workspace("winograd v", (nparts, POINTS, slab, cin))
    m = workspace("winograd m", (nparts, POINTS, slab, cout))
    r = workspace("winograd r", (nparts, POINTS, max(cin, cout)))
    acc = workspace("winograd acc", (nparts, 2 * bands * wd, cout) if accumulate else (0, 0, 0))
    with blas_context:
        run_partitioned(winograd_span, winograd_parallel, nparts, ymat.size * 9 * cin // MACS_PER_ELEMENT, x, u,
                        ymat, v, m, r, acc, bands, *epilogue)


def _check_winograd(direction, w, stride, pad, groups):
    if w.shape[1:3] != (3, 3) or stride != 1 or pad != 1 or groups != 1:
        raise ValueError(f"{direction}: the winograd algorithm computes 3x3 convolutions of stride 1, padding 1 "
                         f"and groups 1; got kernel {w.shape[1]}x{w.shape[2]}, stride {stride}, padding {pad}, "
                         f"groups {groups} (let planner.conv_algorithm choose the algorithm)")


def _run_depthwise_forward(x, w, y, stride, pad):
    run_split(_depthwise_forward_span, _depthwise_forward_parallel, y.size * w.shape[1] * w.shape[2], x,
              _depthwise_weight(w), y, stride, pad)


def _run_depthwise_backward(x, w, dy, dx, stride, pad, accumulate):
    """Writes ``dx``; returns dW as ``(KH, KW, C)``."""
    cout, kh, kw, _ = w.shape
    nparts = partitions(x.shape[0])
    dwt_parts = np.zeros((nparts, kh, kw, cout), np.float32)
    want_dx = dx is not None
    run_partitioned(_depthwise_backward_span, _depthwise_backward_parallel, nparts, dy.size * kh * kw, x,
                    _depthwise_weight(w), dy, dx if want_dx else _NO_DX, dwt_parts, stride, pad, want_dx, accumulate)
    return dwt_parts.sum(axis=0)


def _algorithms(x, w, stride, pad, groups, algorithms):
    """The plan's choice (`planner.conv_algorithm`, recorded in the op), or the same rule applied here to the input
    ``x``."""
    return conv_algorithms(w.shape, stride, pad, groups, x.shape[:3]) if algorithms is None else algorithms


def conv2d_forward(x, w, y, stride, pad, groups, col, algorithms=None, epilogue=None):
    """``y = conv2d(x, w)``; x ``(N,H,W,Cin)``, w ``(Cout,KH,KW,Cin//groups)``, y ``(N,OH,OW,Cout)``.
    ``algorithms``: the plan's `ConvAlgorithms` for the layer (default: the rule of the shapes).
    ``epilogue``: a `cpu_ref._epilogue.Epilogue` whose result goes to ``epilogue.out`` (``y`` is then a
    workspace: its contents are unspecified); groups 1 and the pointwise, direct, winograd or general algorithm
    only (`epilogue_supported`)."""
    cout = w.shape[0]
    algorithm = _algorithms(x, w, stride, pad, groups, algorithms).forward
    if epilogue is not None and not epilogue_supported(algorithm, groups):
        raise ValueError(f"conv2d_forward: an epilogue needs groups 1 and the pointwise, direct, winograd or gemm "
                         f"algorithm; got groups {groups}, algorithm {algorithm!r} (run the chain's kernels one by "
                         f"one)")
    epilogue = NONE if epilogue is None else epilogue
    if algorithm == "depthwise":
        _run_depthwise_forward(x, w, y, stride, pad)
    elif algorithm == "pointwise":
        _run_pointwise(x, w, y.reshape(-1, cout), None, False, False, epilogue)
    elif algorithm == "direct":
        direct_forward(x, w, y, stride, pad, y.size * w[0].size // MACS_PER_ELEMENT, epilogue)
    elif algorithm == "winograd":
        _check_winograd("conv2d_forward", w, stride, pad, groups)
        _run_winograd(x, w, y.reshape(-1, cout), epilogue)
    else:
        _run_gemm(x, w, y.reshape(-1, cout), None, stride, pad, col, False, False, epilogue)


def forward_workspace_used(x_shape, w_shape, stride, pad, groups, algorithm):
    """Elements at the start of ``col`` that `conv2d_forward` may write: a chunk of im2col rows per partition
    of the general algorithm, for any thread count; none for the others. The forward leaves the rest alone."""
    if algorithm != "gemm":
        return 0
    n, h, wd, _ = x_shape
    cout, kh, kw, cg = w_shape
    rows = n * conv_output_size(h, kh, stride, pad) * conv_output_size(wd, kw, stride, pad)
    most = 1 if BLAS_THREADS is None else max(1, min(numba.config.NUMBA_NUM_THREADS, rows))
    # the most for any thread count the pool can be set to
    return max(nparts * _gemm_chunk_rows(rows // nparts, kh * kw * cg, cout // groups)[0] * kh * kw * cg
               for nparts in range(1, most + 1))


def epilogue_supported(algorithm, groups):
    """Whether `conv2d_forward` takes an epilogue for a layer of ``groups`` computed by ``algorithm``."""
    return groups == 1 and algorithm in ("pointwise", "direct", "winograd", "gemm")


def conv2d_backward(x, w, dy, dx, dw, stride, pad, groups, col, accumulate, algorithms=None):
    """``dw`` (overwritten) and ``dx`` (overwritten, or added into when ``accumulate``; skipped when ``None``).
    ``algorithms``: as for `conv2d_forward`; a ``gemm`` input gradient computes the weight gradient in the
    same pass, whatever the weight gradient's entry says."""
    cout = w.shape[0]
    chosen = _algorithms(x, w, stride, pad, groups, algorithms)
    if chosen.input_grad == "depthwise":
        dw[:, :, :, 0] = _run_depthwise_backward(x, w, dy, dx, stride, pad, accumulate).transpose(2, 0, 1)
    elif chosen.input_grad == "pointwise":
        dw.reshape(cout, -1)[...] = _run_pointwise(x, w, dy.reshape(-1, cout), dx, True, accumulate)
    else:
        direct_dx = dx is not None and chosen.input_grad == "direct"
        winograd_dx = dx is not None and chosen.input_grad == "winograd"
        direct_dw = chosen.weight_grad == "direct" and (dx is None or direct_dx)
        work = dy.size * w[0].size // MACS_PER_ELEMENT
        if direct_dx:
            direct_input_grad(dy, w, dx, stride, pad, accumulate, work)
        if winograd_dx:
            _check_winograd("conv2d_backward", w, stride, pad, groups)
            _run_winograd(dy, w, dx.reshape(-1, dx.shape[3]), accumulate=accumulate, turned=True)
        if direct_dw:
            dw[...] = direct_weight_grad(x, dy, w.shape, stride, pad, work)
        else:
            dw.reshape(cout, -1)[...] = _run_gemm(x, w, dy.reshape(-1, cout), None if direct_dx or winograd_dx else dx,
                                                  stride, pad, col, True, accumulate).T
