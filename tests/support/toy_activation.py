"""A toy activation, ``square``, added as a row of the op table and nowhere else.

The tests hand this extended table with each path's ``pointwise`` to
`planner.kernel_table.activation_kernels`, exactly as the paths build their kernels from `planner.ops.OPS`
at import: a new activation row gets its kernels on both paths with no edit in
`cpu_ref/` or `cuda_kernels/`. The row is a copy of silu's (a row saving its input) with its own kind,
numpy reference pair and float32 scalar pair.
"""
import dataclasses
import enum

import numpy as np

from planner.ops import OPS, Prim

_TWO = np.float32(2.0)


class ToyPrim(enum.StrEnum):
    SQUARE = "square"


def square(x, _a, _b):            # the scalar pair: plain Python, as planner/scalar_activations.py
    return x * x


def square_grad(x, dy, _a, _b):
    return _TWO * x * dy


def square_reference(x, *_):   # the numpy reference pair (the spec)
    return x * x


def square_reference_grad(x, dy, *_):
    return 2 * x * dy


SQUARE_ROW = dataclasses.replace(OPS[Prim.SILU], prim=ToyPrim.SQUARE, reference_forward=square_reference,
                                 reference_backward=square_reference_grad, scalar_forward=square,
                                 scalar_backward=square_grad)
TABLE_WITH_SQUARE = {**OPS, ToyPrim.SQUARE: SQUARE_ROW}   # the op table with one more activation row
