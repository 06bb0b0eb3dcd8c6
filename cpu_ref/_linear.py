"""Fully connected layer, ``y = x @ W.T + b`` with ``W`` of shape ``(out, in)`` (PyTorch's layout).

The three products (``y = x @ W.T``, ``dW = dy.T @ x``, ``dx = dy @ W``) run one of two ways, which the executor
chooses per plan (`cpu_ref._executor.threaded_linear`):

- **partitioned** (``threaded=False``), as the convolutions' GEMMs (`cpu_ref._conv`): on numba's thread pool,
  each partition multiplying its slice of the output *columns* (of ``dW``, its rows) with a single-threaded SciPy
  BLAS call (`one_blas_thread`), so that the batch's rows stay whole (128 rows cut in two made the GEMMs 5-30%
  slower) and no second thread pool runs next to numba's. A column slice is not contiguous and numba's ``np.dot``
  takes contiguous arrays only, so the partitions call ``sgemm`` of ``scipy.linalg.cython_blas`` with leading
  dimensions (`_sgemm`).
- **threaded** (``threaded=True``): numpy's ``matmul`` on its own multi-threaded OpenBLAS, which shares the packed
  operands between its threads: on the MLP's 128-row products it was 10-35% faster than the partitions (2 threads,
  Zen 4, more so with the Haswell kernels). But OpenBLAS's idle workers spin for tens of milliseconds after each
  call, on the cores numba's threads need next: resnet50's eval forward (batch 8, 2 threads) ran 12% slower back to
  back with its one ``fc`` layer threaded.

Without SciPy's thread control (`cpu_ref._blas`) the partitioned products make one call, which the BLAS
parallelises itself. The bias reduction is a numba kernel with per-partition float64 sums, added in
partition order.
"""
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import get_cython_function_address, intrinsic

from cpu_ref._blas import BLAS_THREADS, one_blas_thread
from cpu_ref._conv import MACS_PER_ELEMENT
from cpu_ref._misc import flat, partition, partitions, run_partitioned

#: ``sgemm`` of SciPy's BLAS (the library `cpu_ref._blas` pins), passed to the kernels as an integer: a
#: function pointer held as a global would keep numba from caching them.
SGEMM_ADDRESS = get_cython_function_address("scipy.linalg.cython_blas", "sgemm")
_N, _T = ord("N"), ord("T")


@intrinsic
def _sgemm(typingctx, address, trans_a, trans_b, m, n, k, a, a_at, lda, b, b_at, ldb, beta, c, c_at, ldc):
    """Row-major ``C[m, n] = op(A) @ op(B) + beta * C`` (``alpha`` 1), ``op`` per ``trans_*`` (``ord("N")`` or
    ``ord("T")``), on the matrices that start at element ``*_at`` of the 1-D float32 arrays ``a``, ``b``, ``c``
    with row strides ``lda``, ``ldb``, ``ldc``. BLAS is column-major: a row-major ``C = op(A) op(B)`` is the
    column-major ``C.T = op(B).T op(A).T``, so the call swaps the operands and their sizes. No bounds checks."""
    def codegen(context, builder, sig, args):
        ptr = ir.IntType(8).as_pointer()

        def scalar(index, to_type):
            value = context.cast(builder, args[index], sig.args[index], to_type)
            slot = cgutils.alloca_once_value(builder, value)
            return builder.bitcast(slot, ptr)

        def element(index):   # the address of array args[index] at element args[index + 1]
            data = context.make_array(sig.args[index])(context, builder, args[index]).data
            at = context.cast(builder, args[index + 1], sig.args[index + 1], types.intp)
            return builder.bitcast(builder.gep(data, [at]), ptr)

        one = cgutils.alloca_once_value(builder, ir.Constant(ir.FloatType(), 1.0))
        fn = builder.inttoptr(args[0], ir.FunctionType(ir.VoidType(), [ptr] * 13).as_pointer())
        builder.call(fn, [scalar(2, types.int8), scalar(1, types.int8), scalar(4, types.int32), scalar(3, types.int32),
                          scalar(5, types.int32), builder.bitcast(one, ptr), element(9), scalar(11, types.int32),
                          element(6), scalar(8, types.int32), scalar(12, types.float32), element(13),
                          scalar(15, types.int32)])
        return context.get_dummy_value()
    integers = (address, trans_a, trans_b, m, n, k, a_at, lda, b_at, ldb, c_at, ldc)
    arrays = (a, b, c)
    if not (all(isinstance(t, types.Integer) for t in integers)
            and all(isinstance(t, types.Array) and t.dtype == types.float32 and t.ndim == 1 for t in arrays)
            and isinstance(beta, types.Float)):
        return None
    return types.none(address, trans_a, trans_b, m, n, k, a, a_at, lda, b, b_at, ldb, beta, c, c_at, ldc), codegen


@njit(cache=True)
def _product_span(address, x, w, dy, out, m, k, n, beta, kind, t, nparts):
    """Partition ``t`` of one product into ``out`` (all arrays 1-D views of C-contiguous matrices; ``x`` is
    ``(m, k)``, ``w`` ``(n, k)``, ``dy`` ``(m, n)``):

    - ``kind`` 0, ``y = x @ W.T``: columns of ``y`` (``out`` ``(m, n)``);
    - ``kind`` 1, ``dW = dy.T @ x``: rows of ``dW`` (``out`` ``(n, k)``);
    - ``kind`` 2, ``dx = dy @ W + beta * dx``: columns of ``dx`` (``out`` ``(m, k)``).
    """
    if kind == 0:
        lo, hi = partition(n, t, nparts)
        if hi > lo:
            _sgemm(address, _N, _T, m, hi - lo, k, x, 0, k, w, lo * k, k, beta, out, lo, n)
    elif kind == 1:
        lo, hi = partition(n, t, nparts)
        if hi > lo:
            _sgemm(address, _T, _N, hi - lo, k, m, dy, lo, n, x, 0, k, beta, out, lo * k, k)
    else:
        lo, hi = partition(k, t, nparts)
        if hi > lo:
            _sgemm(address, _N, _N, m, hi - lo, n, dy, 0, n, w, lo, k, beta, out, lo, k)


@njit(cache=True, parallel=True)
def _product_parallel(address, x, w, dy, out, m, k, n, beta, kind, nparts):
    for t in prange(nparts):
        _product_span(address, x, w, dy, out, m, k, n, beta, kind, t, nparts)


_EMPTY = np.zeros(0, np.float32)


def _product(kind, x2d, w, dy, out, accumulate=False):
    """One of `_product_span`'s products into ``out``, one partition per thread of its split dimension; the
    pool wakes for large products only (`run_partitioned`), and each partition's BLAS call is single-threaded."""
    n, k = w.shape
    m = dy.shape[0] if x2d is None else x2d.shape[0]
    args = (SGEMM_ADDRESS, _flat(x2d), _flat(w), _flat(dy), _flat(out), m, k, n, np.float32(accumulate), kind)
    if BLAS_THREADS is None:   # cannot pin SciPy's BLAS: one call, which the BLAS parallelises itself
        _product_span(*args, 0, 1)
        return
    with one_blas_thread():
        run_partitioned(_product_span, _product_parallel, partitions(k if kind == 2 else n), m * n * k // MACS_PER_ELEMENT,
                        *args)


def _flat(a):
    """`cpu_ref._misc.flat` of a float32 array (the products' operands), or an empty one for ``None``."""
    if a is None:
        return _EMPTY
    if a.dtype != np.float32:
        raise TypeError(f"cpu_ref linear kernels expect float32 arrays; got {a.dtype}")
    return flat(a)


@njit(cache=True)
def _column_sums_span(a, parts, t, nparts):
    """``parts[t]`` = the column sums of partition ``t``'s rows, in float64."""
    lo, hi = partition(a.shape[0], t, nparts)
    out = parts[t]
    for ch in range(out.size):
        out[ch] = 0.0
    for r in range(lo, hi):
        ar = a[r]
        for ch in range(out.size):
            out[ch] += ar[ch]


@njit(cache=True, parallel=True)
def _column_sums_parallel(a, parts, nparts):
    for t in prange(nparts):
        _column_sums_span(a, parts, t, nparts)


def _column_sums(a, out):
    """``out = a.sum(axis=0)``: float64 partials per partition, added in partition order."""
    nparts = partitions(a.shape[0])
    parts = np.empty((nparts, a.shape[1]))
    run_partitioned(_column_sums_span, _column_sums_parallel, nparts, a.size, a, parts)
    out[:] = parts.sum(axis=0)


def linear_forward(x2d, w, b, y, threaded=False):
    """``y = x2d @ w.T (+ b)``; ``x2d`` ``(M, in)``, ``w`` ``(out, in)``, ``y`` ``(M, out)``, all C-contiguous.
    ``threaded``: numpy's multi-threaded BLAS instead of the partitions (see the module header)."""
    _checked_out(y, (x2d.shape[0], w.shape[0]))
    if threaded:
        np.matmul(x2d, w.T, out=y)
    else:
        _product(0, x2d, w, None, y)
    if b is not None:
        y += b


def linear_backward(x2d, w, dy, dx, dw, db, accumulate, threaded=False):
    """``dw = dy.T @ x`` and ``db = dy.sum(0)`` (overwritten); ``dx = dy @ W`` (skipped when ``None``; added into
    when ``accumulate``). ``threaded``: as for `linear_forward`."""
    _checked_out(dw, w.shape)
    if threaded:
        np.matmul(dy.T, x2d, out=dw)
    else:
        _product(1, x2d, w, dy, dw)
    if db is not None:
        _column_sums(dy, db)
    if dx is None:
        return
    _checked_out(dx, (dy.shape[0], w.shape[1]))
    if not threaded:
        _product(2, None, w, dy, dx, accumulate)
    elif accumulate:
        dx += dy @ w
    else:
        np.matmul(dy, w, out=dx)


def _checked_out(a, shape):
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"cpu_ref linear kernels: an output of shape {tuple(a.shape)}, expected {tuple(shape)}")
