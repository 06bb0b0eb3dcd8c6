"""The fully connected layer's three products, split into column (dW: row) partitions that each call SciPy's
``sgemm`` with leading dimensions (`cpu_ref._linear`). Each is checked against float64 within float32's
summation bound, ``K * 2**-23 * (|A| @ |B|)`` elementwise (recursive summation of ``K`` products has relative
error at most about ``K * 2**-24``; twice that for margin): a wrong offset or leading dimension in any
partition gives errors of the size of the values themselves."""
import numpy as np
import pytest

from blueprint import BluePrint, cbr, fc, gap, seq, zoo
from cpu_ref import CpuExecutor, _linear
from cpu_ref import kernels as K
from cpu_ref._linear import SGEMM_ADDRESS, _product_span
from cpu_ref.kernels import linear_backward, linear_forward
from planner import ArchPlan
from planner.compiler import Compiler

#: (rows, in, out): odd sizes so partitions are uneven; the last two are large enough (>= 4M multiply-adds) for
#: the thread pool where it has more than one thread.
SHAPES = [(5, 7, 4), (33, 17, 3), (64, 256, 300), (37, 517, 301)]


def _bound(a, b, k):
    return k * 2.0 ** -23 * (np.abs(a) @ np.abs(b)) + 1e-30


def _close(got, a, b, k):
    exact = a @ b
    assert np.all(np.abs(got.astype(np.float64) - exact) <= _bound(a, b, k)), \
        f"max error {np.abs(got - exact).max():.3g} above float32's bound {_bound(a, b, k).max():.3g}"


def _data(m, k, n):
    rng = np.random.default_rng(m * 1000 + n)
    return (rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32),
            rng.standard_normal(n).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32))


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_products_against_float64(m, k, n, threaded):
    x, w, b, dy = _data(m, k, n)
    x64, w64, dy64 = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    y = np.full((m, n), np.nan, np.float32)
    linear_forward(x, w, b, y, threaded)
    _close(y - b, x64, w64.T, k)   # the bias add is one rounding more: within the bound's margin
    dx, dw, db = (np.full(s, np.nan, np.float32) for s in ((m, k), (n, k), (n,)))
    linear_backward(x, w, dy, dx, dw, db, False, threaded)
    _close(dw, dy64.T, x64, m)
    _close(dx, dy64, w64, n)
    np.testing.assert_allclose(db, dy64.sum(0), rtol=0, atol=m * 2.0 ** -23 * np.abs(dy64).sum(0).max())
    before = dx.copy()
    linear_backward(x, w, dy, dx, dw, None, True, threaded)
    np.testing.assert_array_equal(dx, before + before)   # adds the same product (beta 1): exactly twice


@pytest.mark.parametrize("nparts", [2, 3, 7])
@pytest.mark.parametrize("kind", [0, 1, 2])
def test_partitions_cover_the_product(kind, nparts):
    """Every partition run one after another gives what one partition gives, on any pool size: each writes
    only its own columns (rows), at the right offsets."""
    m, k, n = 37, 61, 29
    x, w, _, dy = _data(m, k, n)
    shape = {0: (m, n), 1: (n, k), 2: (m, k)}[kind]
    whole, parts = np.full(shape, np.nan, np.float32), np.full(shape, np.nan, np.float32)
    args = (SGEMM_ADDRESS, x.reshape(-1), w.reshape(-1), dy.reshape(-1))
    _product_span(*args, whole.reshape(-1), m, k, n, np.float32(0), kind, 0, 1)
    for t in range(nparts):
        _product_span(*args, parts.reshape(-1), m, k, n, np.float32(0), kind, t, nparts)
    assert not np.isnan(parts).any(), "a partition left its part of the output unwritten"
    exact = {0: (x.astype(np.float64), w.T.astype(np.float64)), 1: (dy.T.astype(np.float64), x.astype(np.float64)),
             2: (dy.astype(np.float64), w.astype(np.float64))}[kind]
    _close(parts, *exact, exact[0].shape[1])
    _close(whole, *exact, exact[0].shape[1])


def test_wrong_arrays_are_refused():
    x, w, b, _ = _data(4, 6, 3)
    with pytest.raises(ValueError, match="C-contiguous"):
        linear_forward(np.asfortranarray(x), w, b, np.empty((4, 3), np.float32))
    with pytest.raises(ValueError, match=r"output of shape \(4, 2\), expected \(4, 3\)"):
        linear_forward(x, w, b, np.empty((4, 2), np.float32))
    with pytest.raises(TypeError, match="float32"):
        linear_forward(x.astype(np.float64), w, b, np.empty((4, 3), np.float32))


def test_one_pool_only():
    """The products pin SciPy's BLAS to one thread while they run (no second pool spinning next to numba's) and
    leave its thread count as they found it."""
    if _linear.BLAS_THREADS is None:
        pytest.skip("no thread control found for SciPy's OpenBLAS (the products then let it parallelise itself)")
    get, _ = _linear.BLAS_THREADS
    seen = []
    original = _linear.run_partitioned

    def spy(*args):
        seen.append(get())
        return original(*args)

    before = get()
    x, w, b, _ = _data(64, 256, 300)
    try:
        _linear.run_partitioned = spy
        linear_forward(x, w, b, np.empty((64, 300), np.float32))
    finally:
        _linear.run_partitioned = original
    assert seen == [1] and get() == before


@pytest.mark.parametrize("name,bp,threaded", [
    ("mlp", zoo.mlp([12, 16, 8, 3]), True),
    ("convolutions", BluePrint(seq(cbr(8, 3, 1, 1), gap(), fc(3))), False),
])
def test_executor_chooses_by_the_plan(name, bp, threaded, monkeypatch):
    """An MLP's fully connected layers run on the threaded BLAS, a convolutional network's partitioned
    (`cpu_ref._executor.THREADED_LINEAR_SHARE`), in the forward and the backward."""
    shape = (4, 1, 1, 12) if name == "mlp" else (4, 6, 6, 3)
    plan = Compiler(ArchPlan.from_blueprint(bp, in_channels=shape[3])).compile({"train": shape, "eval": shape})
    seen = []
    for fn in ("linear_forward", "linear_backward"):
        original = getattr(K, fn)
        monkeypatch.setattr(K, fn, lambda *a, _f=original, _n=fn: (seen.append((_n, a[-1])), _f(*a))[1])
    ex = CpuExecutor(plan, seed=0)
    ex.train_step(np.ones(shape, np.float32), np.zeros(4, np.int64), 0.01)
    assert {n for n, _ in seen} == {"linear_forward", "linear_backward"}
    assert all(flag is threaded for _, flag in seen), seen
