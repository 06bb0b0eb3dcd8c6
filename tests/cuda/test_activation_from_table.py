"""A new activation row gets its CUDA kernels from the op table alone (tests/support/toy_activation.py).

`planner.kernel_table.activation_kernels(OPS, pointwise)` is how `cuda_kernels.elementwise` builds
`ACTIVATION_KERNELS` (and the kernel-table rows ``activation_forward.<kind>`` /
``activation_backward.<kind>``) at import; handed the table with a toy ``square`` row added, it declares
that row's two kernels with the same signatures, and the launchers run them (simulator) against the
row's numpy reference. The PTX of the toy's kernels is checked in test_ptx.py. No file of
`cuda_kernels/` names the toy.
"""

import numpy as np
import pytest
from numba import cuda

from cuda_kernels import elementwise, registry
from cuda_kernels.tape import Immediate
from planner.kernel_table import activation_kernels
from planner.ops import ACTIVATIONS, OPS, Prim

from tests.support.toy_activation import SQUARE_ROW, TABLE_WITH_SQUARE, ToyPrim  # noqa: E402

FP16_HALF_ULP = 2.0 ** -11


def test_the_module_table_is_generated_from_every_activation_row():
    assert tuple(elementwise.ACTIVATION_KERNELS) == ACTIVATIONS


@pytest.fixture
def with_square(monkeypatch):
    """The CUDA kernels generated from the op table with the toy row, declared in a scratch kernel table
    (so the module's table, which the PTX and coverage tests walk, stays as it is)."""
    monkeypatch.setattr(registry, "KERNELS", {})
    kernels = activation_kernels(TABLE_WITH_SQUARE, elementwise.pointwise)
    monkeypatch.setattr(elementwise, "ACTIVATION_KERNELS", kernels)
    return kernels


def test_a_new_activation_row_gets_its_two_kernel_table_rows(with_square):
    assert tuple(with_square) == ACTIVATIONS + (ToyPrim.SQUARE,)
    toy, relu = with_square[ToyPrim.SQUARE], registry.KERNELS["activation_forward.relu"]
    assert (toy.forward.name, toy.backward.name) == ("activation_forward.square", "activation_backward.square")
    assert registry.KERNELS["activation_forward.square"] is toy.forward
    assert toy.forward.signature == relu.signature
    assert toy.backward.signature == registry.KERNELS["activation_backward.relu"].signature


@pytest.mark.parametrize("accumulate", [False, True])
def test_a_new_activation_row_gets_cuda_kernels_with_no_other_edit(with_square, accumulate):
    rng = np.random.default_rng(5)
    x, dy, dx0 = ((rng.standard_normal(37) * 2).astype(np.float16) for _ in range(3))
    y = cuda.to_device(np.full(x.size, np.nan, np.float16))
    elementwise.activation_forward(Immediate(), ToyPrim.SQUARE, cuda.to_device(x), y)
    want = SQUARE_ROW.reference_forward(x.astype(np.float64))
    np.testing.assert_allclose(y.copy_to_host(), want, rtol=FP16_HALF_ULP, atol=2.0 ** -25)   # the fp16 store's rounding
    dx = cuda.to_device(dx0)
    elementwise.activation_backward(Immediate(), ToyPrim.SQUARE, cuda.to_device(x), cuda.to_device(dy), dx, (),
                                     accumulate)
    want = SQUARE_ROW.reference_backward(x.astype(np.float64), dy.astype(np.float64)) + (dx0 if accumulate else 0)
    np.testing.assert_allclose(dx.copy_to_host(), want, rtol=2 * FP16_HALF_ULP, atol=FP16_HALF_ULP * np.abs(want).max())


def test_a_row_that_is_not_an_activation_is_refused():
    with pytest.raises(ValueError, match=r"pointwise\(<Prim.CONV: 'conv'>\): expected an activation row"):
        elementwise.pointwise(OPS[Prim.CONV])
