"""A new activation row gets its CPU kernels from the op table alone (tests/support/toy_activation.py).

`planner.kernel_table.activation_kernels(OPS, pointwise)` is how `cpu_ref._activation` builds
`ACTIVATION_KERNELS` at import; handed the table with a toy ``square`` row added, it generates that
row's kernels too, and the public launchers run them against the row's numpy reference. No file of
`cpu_ref/` names the toy.
"""

import numpy as np
import pytest

from cpu_ref import _activation, _misc
from cpu_ref import kernels as K
from planner.kernel_table import activation_kernels
from planner.ops import ACTIVATIONS, OPS

from tests.support.toy_activation import SQUARE_ROW, TABLE_WITH_SQUARE, ToyPrim  # noqa: E402

F32_EPS = float(np.finfo(np.float32).eps)


def test_the_module_table_is_generated_from_every_activation_row():
    assert tuple(_activation.ACTIVATION_KERNELS) == ACTIVATIONS
    assert tuple(activation_kernels(OPS, _activation.pointwise)) == ACTIVATIONS


@pytest.fixture(params=["calling_thread", "thread_pool"])
def with_square(request, monkeypatch):
    """The CPU kernels generated from the op table with the toy row; both ways a kernel runs."""
    if request.param == "thread_pool":
        monkeypatch.setattr(_misc, "PARALLEL_MIN_ELEMENTS", 1)
    kernels = activation_kernels(TABLE_WITH_SQUARE, _activation.pointwise)
    assert tuple(kernels) == ACTIVATIONS + (ToyPrim.SQUARE,)
    monkeypatch.setattr(_activation, "ACTIVATION_KERNELS", kernels)


@pytest.mark.parametrize("accumulate", [False, True])
def test_a_new_activation_row_gets_cpu_kernels_with_no_other_edit(with_square, accumulate):
    rng = np.random.default_rng(3)
    x, dy, dx0 = (rng.standard_normal(53).astype(np.float32) * 3 for _ in range(3))
    y = np.full_like(x, np.nan)
    K.activation_forward(ToyPrim.SQUARE, x, y)
    want = SQUARE_ROW.reference_forward(x.astype(np.float64))
    np.testing.assert_allclose(y, want, rtol=F32_EPS, atol=0)          # one fp32 rounding
    dx = dx0.copy()
    K.activation_backward(ToyPrim.SQUARE, x, dy, dx, (), accumulate)
    want = SQUARE_ROW.reference_backward(x.astype(np.float64), dy.astype(np.float64)) + (dx0 if accumulate else 0)
    np.testing.assert_allclose(dx, want, rtol=4 * F32_EPS, atol=4 * F32_EPS * np.abs(want).max())


def test_a_row_that_is_not_an_activation_is_refused():
    with pytest.raises(ValueError, match=r"pointwise\(<Prim.CONV: 'conv'>\): expected an activation row"):
        _activation.pointwise(OPS["conv"])
