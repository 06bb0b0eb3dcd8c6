"""conv2d forward and backward (NHWC activations, OHWI weights, fp32).

Three algorithms, chosen from the shapes:
- general: im2col of a chunk of output rows into the worker's slice of ``col``, then one
  BLAS GEMM per chunk (and group). A chunk is sized to stay in L2, so the im2col matrix
  never makes a round trip through memory.
- pointwise (1x1, stride 1, pad 0, groups 1): the input *is* the matrix; no workspace.
- depthwise (groups == Cin == Cout): a direct loop, vectorised over channels; no workspace.

Parallelism: ``prange`` over ``nworkers`` static partitions, each calling a
single-threaded BLAS (numba's ``np.dot`` uses SciPy's BLAS; several threads calling a
multi-threaded OpenBLAS at once serialise badly, so the wrappers pin it to one thread for
the duration of a call). The backward pass partitions by *sample*, so that the col2im
scatter of two workers never touches the same ``dx`` element, and sums per-worker weight
gradients in a fixed order: results are deterministic for a given thread count.
"""
import contextlib
import ctypes
import glob
import os

import numba
import numpy as np
from numba import njit, prange, uint64

#: Bytes of im2col matrix a worker fills per GEMM: about one L2, so the GEMM reads it from cache.
COL_CHUNK_BYTES = 1 << 19


# ---------------------------------------------------------------------------- BLAS threads

def _find_blas_thread_control():
    """``(get, set)`` for the thread count of the OpenBLAS SciPy bundles, or ``None``."""
    try:
        import scipy
    except ImportError:
        return None
    libs = glob.glob(os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)), "scipy.libs", "*openblas*"))
    for path in libs:
        lib = ctypes.CDLL(path)
        for prefix in ("scipy_openblas_", "openblas_"):
            get = getattr(lib, prefix + "get_num_threads", None)
            set_ = getattr(lib, prefix + "set_num_threads", None)
            if get is not None and set_ is not None:
                get.restype = ctypes.c_int
                set_.argtypes = [ctypes.c_int]
                return get, set_
    return None


_BLAS_THREADS = _find_blas_thread_control()


@contextlib.contextmanager
def _blas_pinned_to_one_thread():
    get, set_ = _BLAS_THREADS
    previous = get()
    set_(1)
    try:
        yield
    finally:
        set_(previous)


def _parallel_workers():
    """Worker count for a GEMM kernel, and the context its BLAS calls must run in."""
    if _BLAS_THREADS is None:  # cannot pin BLAS threads: one worker, BLAS parallelises itself
        return 1, contextlib.nullcontext()
    return numba.get_num_threads(), _blas_pinned_to_one_thread()


def _chunk_rows(rows_per_worker, row_len):
    return max(1, min(rows_per_worker, COL_CHUNK_BYTES // (4 * row_len)))


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

@njit(cache=True, parallel=True)
def _conv_forward_gemm(x, w2d, y2d, s, p, groups, kh, kw, colf, chunk, nworkers):
    n_, h, w, c = x.shape
    oh_, ow_ = (h + 2 * p - kh) // s + 1, (w + 2 * p - kw) // s + 1
    cg = c // groups
    kg = w2d.shape[0] // groups
    kd = kh * kw * cg
    rows = n_ * oh_ * ow_
    per = (rows + nworkers - 1) // nworkers
    xf = x.reshape(-1)
    for t in prange(nworkers):
        cw = colf[t * chunk * kd:(t + 1) * chunk * kd]
        cmat = cw.reshape(chunk, kd)
        yg = np.empty((chunk if groups > 1 else 0, kg), np.float32)
        hi = min(rows, (t + 1) * per)
        for r0 in range(t * per, hi, chunk):
            r1 = min(hi, r0 + chunk)
            m = r1 - r0
            for g in range(groups):
                _im2col_rows(xf, h, w, c, cw, r0, r1, g * cg, cg, oh_, ow_, kh, kw, s, p)
                wg = w2d[g * kg:(g + 1) * kg]
                if groups == 1:
                    np.dot(cmat[:m], wg.T, y2d[r0:r1])
                else:
                    np.dot(cmat[:m], wg.T, yg[:m])
                    y2d[r0:r1, g * kg:(g + 1) * kg] = yg[:m]


@njit(cache=True, parallel=True)
def _conv_backward_gemm(x, w2d, dy2d, dx, dw2d, s, p, groups, kh, kw, colf, chunk, nworkers, accumulate):
    n_, h, w, c = x.shape
    oh_, ow_ = (h + 2 * p - kh) // s + 1, (w + 2 * p - kw) // s + 1
    cg = c // groups
    kg = w2d.shape[0] // groups
    kd = kh * kw * cg
    per_n = (n_ + nworkers - 1) // nworkers
    xf = x.reshape(-1)
    dwt_parts = np.zeros((nworkers, kd, kg * groups), np.float32)   # dw transposed: col.T @ dy is the faster GEMM
    for t in prange(nworkers):
        n0, n1 = min(n_, t * per_n), min(n_, (t + 1) * per_n)
        cw = colf[t * chunk * kd:(t + 1) * chunk * kd]
        cmat = cw.reshape(chunk, kd)
        dyg = np.empty((chunk if groups > 1 else 0, kg), np.float32)
        dwtg = np.empty((kd, kg), np.float32)
        if dx is not None:
            dxf = dx.reshape(-1)
            if not accumulate:
                dxf[n0 * h * w * c:n1 * h * w * c] = 0.0
        hi = n1 * oh_ * ow_
        for r0 in range(n0 * oh_ * ow_, hi, chunk):
            r1 = min(hi, r0 + chunk)
            m = r1 - r0
            for g in range(groups):
                _im2col_rows(xf, h, w, c, cw, r0, r1, g * cg, cg, oh_, ow_, kh, kw, s, p)
                if groups == 1:
                    dy_rows = dy2d[r0:r1]
                else:
                    dyg[:m] = dy2d[r0:r1, g * kg:(g + 1) * kg]
                    dy_rows = dyg[:m]
                np.dot(cmat[:m].T, dy_rows, dwtg)
                dwt_parts[t, :, g * kg:(g + 1) * kg] += dwtg
                if dx is not None:
                    np.dot(dy_rows, w2d[g * kg:(g + 1) * kg], cmat[:m])
                    _col2im_rows(cw, dxf, h, w, c, r0, r1, g * cg, cg, oh_, ow_, kh, kw, s, p)
    for t in range(1, nworkers):
        dwt_parts[0] += dwt_parts[t]
    dw2d[:] = dwt_parts[0].T


# ---------------------------------------------------------------------------- pointwise: the input is the matrix

@njit(cache=True, parallel=True)
def _pointwise_forward(x2d, w2d, y2d, nworkers):
    rows = x2d.shape[0]
    per = (rows + nworkers - 1) // nworkers
    for t in prange(nworkers):
        lo, hi = min(rows, t * per), min(rows, (t + 1) * per)
        if hi > lo:
            np.dot(x2d[lo:hi], w2d.T, y2d[lo:hi])


@njit(cache=True, parallel=True)
def _pointwise_backward(x2d, w2d, dy2d, dx2d, dw2d, chunk, nworkers, accumulate):
    rows = x2d.shape[0]
    per = (rows + nworkers - 1) // nworkers
    dw_parts = np.zeros((nworkers,) + dw2d.shape, np.float32)
    for t in prange(nworkers):
        lo, hi = min(rows, t * per), min(rows, (t + 1) * per)
        if hi > lo:
            np.dot(dy2d[lo:hi].T, x2d[lo:hi], dw_parts[t])
        if dx2d is not None:
            if not accumulate:
                if hi > lo:
                    np.dot(dy2d[lo:hi], w2d, dx2d[lo:hi])
            else:
                tmp = np.empty((chunk, dx2d.shape[1]), np.float32)
                for r0 in range(lo, hi, chunk):
                    r1 = min(hi, r0 + chunk)
                    np.dot(dy2d[r0:r1], w2d, tmp[:r1 - r0])
                    dx2d[r0:r1] += tmp[:r1 - r0]
    dw2d[:] = dw_parts[0]
    for t in range(1, nworkers):
        dw2d += dw_parts[t]


# ---------------------------------------------------------------------------- depthwise: a direct loop

@njit(cache=True, parallel=True)
def _depthwise_forward(x, wt, y, s, p):
    """``wt`` is the weight as ``(KH, KW, C)``."""
    n_, h, w, c = x.shape
    _, oh_, ow_, _ = y.shape
    kh, kw, _ = wt.shape
    for row in prange(n_ * oh_):
        n, oh = row // oh_, row % oh_
        for ow in range(ow_):
            out = y[n, oh, ow]
            out[:] = 0.0
            for i in range(kh):
                ih = oh * s - p + i
                if ih < 0 or ih >= h:
                    continue
                for j in range(kw):
                    iw = ow * s - p + j
                    if 0 <= iw < w:
                        xin = x[n, ih, iw]
                        wij = wt[i, j]
                        for ch in range(c):
                            out[ch] += xin[ch] * wij[ch]


@njit(cache=True, parallel=True)
def _depthwise_backward(x, wt, dy, dx, dwt, s, p, nworkers, accumulate):
    n_, h, w, c = x.shape
    _, oh_, ow_, _ = dy.shape
    kh, kw, _ = wt.shape
    per_n = (n_ + nworkers - 1) // nworkers
    dw_parts = np.zeros((nworkers, kh, kw, c), np.float32)
    for t in prange(nworkers):
        n0, n1 = min(n_, t * per_n), min(n_, (t + 1) * per_n)
        dwp = dw_parts[t]
        if dx is not None and not accumulate:
            dx[n0:n1] = 0.0
        for n in range(n0, n1):
            for oh in range(oh_):
                for ow in range(ow_):
                    g = dy[n, oh, ow]
                    for i in range(kh):
                        ih = oh * s - p + i
                        if ih < 0 or ih >= h:
                            continue
                        for j in range(kw):
                            iw = ow * s - p + j
                            if 0 <= iw < w:
                                xin = x[n, ih, iw]
                                dwij = dwp[i, j]
                                for ch in range(c):
                                    dwij[ch] += g[ch] * xin[ch]
                                if dx is not None:
                                    dxin = dx[n, ih, iw]
                                    wij = wt[i, j]
                                    for ch in range(c):
                                        dxin[ch] += g[ch] * wij[ch]
    dwt[:] = dw_parts[0]
    for t in range(1, nworkers):
        dwt += dw_parts[t]


# ---------------------------------------------------------------------------- the contract's entry points

def _is_pointwise(w, stride, pad, groups):
    return w.shape[1] == w.shape[2] == 1 and stride == 1 and pad == 0 and groups == 1


def _is_depthwise(x, w, groups):
    return groups > 1 and groups == x.shape[3] == w.shape[0] and w.shape[3] == 1


def _col_flat(col, x, w, stride, pad, groups):
    n, h, wd, c = x.shape
    _, kh, kw, cg = w.shape
    need = n * conv_output_size(h, kh, stride, pad) * conv_output_size(wd, kw, stride, pad) * kh * kw * cg
    if col is None or col.size < need:
        raise ValueError(f"conv2d: the im2col workspace needs {need} float32 elements; "
                         f"got {0 if col is None else col.size}")
    return col.reshape(-1)


def conv2d_forward(x, w, y, stride, pad, groups, col):
    """``y = conv2d(x, w)``; x ``(N,H,W,Cin)``, w ``(Cout,KH,KW,Cin//groups)``, y ``(N,OH,OW,Cout)``."""
    cout, kh, kw, cg = w.shape
    if _is_depthwise(x, w, groups):
        _depthwise_forward(x, np.ascontiguousarray(w[:, :, :, 0].transpose(1, 2, 0)), y, stride, pad)
        return
    nworkers, blas_context = _parallel_workers()
    with blas_context:
        if _is_pointwise(w, stride, pad, groups):
            _pointwise_forward(x.reshape(-1, x.shape[3]), w.reshape(cout, -1), y.reshape(-1, cout), nworkers)
            return
        colf = _col_flat(col, x, w, stride, pad, groups)
        rows = y.size // cout
        nworkers = min(nworkers, rows)
        chunk = _chunk_rows(rows // nworkers, kh * kw * cg)
        _conv_forward_gemm(x, w.reshape(cout, -1), y.reshape(-1, cout), stride, pad, groups, kh, kw, colf, chunk,
                           nworkers)


def conv2d_backward(x, w, dy, dx, dw, stride, pad, groups, col, accumulate):
    """``dw`` (overwritten) and ``dx`` (overwritten, or added into when ``accumulate``; skipped when ``None``)."""
    cout, kh, kw, cg = w.shape
    nworkers, blas_context = _parallel_workers()
    if _is_depthwise(x, w, groups):
        dwt = np.empty((kh, kw, cout), np.float32)
        _depthwise_backward(x, np.ascontiguousarray(w[:, :, :, 0].transpose(1, 2, 0)), dy, dx, dwt, stride, pad,
                            min(nworkers, x.shape[0]), accumulate)
        dw[:, :, :, 0] = dwt.transpose(2, 0, 1)
        return
    with blas_context:
        if _is_pointwise(w, stride, pad, groups):
            cin = x.shape[3]
            _pointwise_backward(x.reshape(-1, cin), w.reshape(cout, -1), dy.reshape(-1, cout),
                                None if dx is None else dx.reshape(-1, cin), dw.reshape(cout, -1),
                                _chunk_rows(x.size // cin, cin), nworkers, accumulate)
            return
        colf = _col_flat(col, x, w, stride, pad, groups)
        nworkers = min(nworkers, x.shape[0])
        chunk = _chunk_rows(dy.size // cout // nworkers, kh * kw * cg)
        _conv_backward_gemm(x, w.reshape(cout, -1), dy.reshape(-1, cout), dx, dw.reshape(cout, -1), stride, pad,
                            groups, kh, kw, colf, chunk, nworkers, accumulate)
