"""The scalar pairs both paths compile (`planner.scalar_activations`), checked without numba.

Each activation row names its float32 pair; the bodies keep to what `numba.njit` and
`numba.cuda.jit(device=True)` both compile to float32 (typed constants, `math` functions, `min`/`max`);
evaluated as plain Python they agree with the row's numpy reference, the independent spec.
"""
import ast
import dataclasses
import inspect
import math

import numpy as np
import pytest

from planner import scalar_activations as S
from planner.ops import ACTIVATION_SLOTS, ACTIVATIONS, OPS, Prim

from tests.support.kind_params import ACTIVATION_EXAMPLES  # noqa: E402

CALLABLE_IN_A_BODY = {"min", "max"}            # besides math.<function>
# away from every kink (0, +-3, 6): the reference and the body agree there without a convention
POINTS = np.array([-7.3, -4.1, -2.7, -1.3, -0.4, -0.01, 0.02, 0.35, 1.2, 2.6, 4.3, 5.9, 6.7], np.float32)
F32_EPS = float(np.finfo(np.float32).eps)


def _pairs():
    return [(prim, fn) for prim in ACTIVATIONS for fn in (OPS[prim].scalar_forward, OPS[prim].scalar_backward)]


def test_every_activation_row_and_only_those_name_a_pair_of_this_module():
    for prim in Prim:
        row = OPS[prim]
        pair = (row.scalar_forward, row.scalar_backward)
        if row.activation:
            assert all(fn.__module__ == S.__name__ for fn in pair), prim
            # f(x, a, b), grad(saved, dy, a, b): the slots named after the row's attrs, in order, the rest unused
            slots = [list(inspect.signature(fn).parameters)[-ACTIVATION_SLOTS:] for fn in pair]
            counts = [len(inspect.signature(fn).parameters) for fn in pair]
            assert counts == [1 + ACTIVATION_SLOTS, 2 + ACTIVATION_SLOTS], prim
            for names in slots:
                assert tuple(names[:len(row.attrs)]) == row.attrs, (prim, names)
                assert all(name.startswith("_") for name in names[len(row.attrs):]), (prim, names)
        else:
            assert pair == (None, None), prim


@pytest.mark.parametrize("prim, fn", _pairs(), ids=lambda v: getattr(v, "__name__", str(v)))
def test_a_body_calls_only_math_min_max_and_reads_only_float32_constants(prim, fn):
    tree = ast.parse(inspect.getsource(fn))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            math_call = isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "math"
            assert math_call or (isinstance(f, ast.Name) and f.id in CALLABLE_IN_A_BODY), (
                f"{fn.__name__} calls {ast.unparse(f)}: neither compiler takes a plain Python function")
        if isinstance(node, ast.Constant):
            assert not isinstance(node.value, float), f"{fn.__name__}: the literal {node.value} is fp64 on the device"
    for name in fn.__code__.co_names:
        value = getattr(S, name, None) if name != "math" else math
        assert name in CALLABLE_IN_A_BODY or value is math or isinstance(value, np.float32) or hasattr(math, name), (
            f"{fn.__name__} reads {name!r}: only np.float32 constants, math and min/max")


@pytest.mark.parametrize("prim", ACTIVATIONS, ids=str)
def test_the_bodies_agree_with_the_numpy_reference(prim):
    row, params = OPS[prim], ACTIVATION_EXAMPLES[prim]   # every parameter at a value other than its default
    slots = tuple(np.float32(v) for v in params) + (np.float32(0),) * (ACTIVATION_SLOTS - len(params))
    x = POINTS.astype(np.float64)
    want_y = row.reference_forward(x, *params)
    got_y = np.array([row.scalar_forward(v, *slots) for v in POINTS], np.float64)
    dy = np.float32(-1.7)
    saved = want_y.astype(np.float32) if row.saves == ("output",) else POINTS
    want_dx = row.reference_backward(saved.astype(np.float64), float(dy), *params)
    got_dx = np.array([row.scalar_backward(s, dy, *slots) for s in saved], np.float64)
    # a few float32 roundings; values that cancel (gelu's tail) meet the bound relative to the largest
    for got, want in ((got_y, want_y), (got_dx, want_dx)):
        np.testing.assert_allclose(got, want, rtol=8 * F32_EPS, atol=8 * F32_EPS * np.abs(want).max())


@pytest.mark.parametrize("change, activation", [
    (dict(scalar_backward=None), True),                       # an activation row without its whole pair
    (dict(activation=False), False),                          # a pair on a row that is not an activation
], ids=["activation-without-pair", "pair-without-activation"])
def test_a_row_and_its_pair_must_agree(monkeypatch, change, activation):
    from planner import ops
    from tests.support.toy_activation import SQUARE_ROW
    monkeypatch.setattr(ops, "_ROWS", dict(ops._ROWS))   # a scratch table
    with pytest.raises(ValueError, match=rf"the row of 'square' has activation={activation} but scalar pair .*; an "
                                         rf"activation row names its pair in planner/scalar_activations.py"):
        ops.register(dataclasses.replace(SQUARE_ROW, **change))
    ops.register(SQUARE_ROW)   # the fix: the row with its whole pair
    assert ops._ROWS["square"] is SQUARE_ROW
