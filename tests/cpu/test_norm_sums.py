"""BatchNorm's channel sums (`cpu_ref._norm`): float64 sums kept in registers one strip of columns and one chunk
of rows at a time, against float64 numpy, on shapes that leave every remainder: channels that divide the strip,
are a multiple of it, or neither; rows that split unevenly into partitions and chunks; elements left over after
the last whole row of the strip-aligned view."""
import numpy as np
import pytest

from cpu_ref import _norm

SHAPES = [(301, 3), (257, 8), (333, 48), (301, 100), (517, 64), (129, 2 * 32 + 32), (70, 2048), (1, 5), (0, 16)]


def _sums_by_partitions(a, b, nparts):
    c = a.shape[1]
    s1, s2 = np.full((nparts, c), np.nan), np.full((nparts, c), np.nan)
    for t in range(nparts):
        _norm._channel_sums_span(a, b, _norm.lane_columns(c), s1, s2, t, nparts)
    return s1, s2


@pytest.mark.parametrize("nparts", [1, 2, 3])
@pytest.mark.parametrize("m,c", SHAPES, ids=lambda v: str(v))
def test_channel_sums_match_float64(m, c, nparts):
    rng = np.random.default_rng(m * 1000 + c)
    a = (rng.standard_normal((m, c)) * 2 + 3).astype(np.float32)
    b = rng.standard_normal((m, c)).astype(np.float32)
    s1, s2 = _sums_by_partitions(a, b, nparts)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for t in range(nparts):
        lo, hi = min(m, t * -(-m // nparts)), min(m, (t + 1) * -(-m // nparts))
        # float64 sums of float32 values: only the order of the additions differs from numpy's
        np.testing.assert_allclose(s1[t], a64[lo:hi].sum(axis=0), rtol=1e-12, atol=1e-9, err_msg=f"sum a, part {t}")
        np.testing.assert_allclose(s2[t], (a64[lo:hi] * b64[lo:hi]).sum(axis=0), rtol=1e-12, atol=1e-9,
                                   err_msg=f"sum a*b, part {t}")


@pytest.mark.parametrize("m,c", [(333, 48), (517, 64), (301, 3)], ids=lambda v: str(v))
def test_batchnorm_statistics_match_float64(m, c):
    """Forward mean and invstd, and the backward's gamma and beta gradients, on shapes with several strips, chunks
    and leftovers; the float32 outputs against float64 with float32 rounding's tolerance."""
    rng = np.random.default_rng(c)
    x = (rng.standard_normal((m, c)) * 1.5 + 0.5).astype(np.float32)
    dy = rng.standard_normal((m, c)).astype(np.float32)
    gamma, beta = rng.uniform(0.5, 2, c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    y = np.full((m, c), np.nan, np.float32)
    mean, invstd = np.full(c, np.nan, np.float32), np.full(c, np.nan, np.float32)
    rm, rv = np.zeros(c, np.float32), np.ones(c, np.float32)
    _norm.batchnorm_forward_train(x, gamma, beta, y, mean, invstd, rm, rv, 0.1, 1e-5)
    x64 = x.astype(np.float64)
    mean64, var64 = x64.mean(axis=0), x64.var(axis=0)
    invstd64 = 1 / np.sqrt(var64 + 1e-5)
    np.testing.assert_allclose(mean, mean64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(invstd, invstd64, rtol=1e-5)
    np.testing.assert_allclose(y, (x64 - mean64) * invstd64 * gamma + beta, rtol=1e-5, atol=1e-5)
    dgamma, dbeta = np.full(c, np.nan, np.float32), np.full(c, np.nan, np.float32)
    dx = np.full((m, c), np.nan, np.float32)
    _norm.batchnorm_backward(x, gamma, mean, invstd, dy, dx, dgamma, dbeta, False)
    xhat = (x64 - mean64) * invstd64
    dy64 = dy.astype(np.float64)
    np.testing.assert_allclose(dbeta, dy64.sum(axis=0), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dgamma, (dy64 * xhat).sum(axis=0), rtol=1e-5, atol=1e-4)
    dx64 = gamma * invstd64 / m * (m * dy64 - dy64.sum(axis=0) - xhat * (dy64 * xhat).sum(axis=0))
    np.testing.assert_allclose(dx, dx64, rtol=1e-4, atol=1e-5 * np.abs(dx64).max())
