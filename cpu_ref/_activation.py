"""Pointwise activations on flat views, forward and backward side by side.

Every activation of the op table gets its kernels here, generated from its row's float32 scalar pair
(``planner/scalar_activations.py``: ``f(x, a, b)`` and ``f_grad(saved, dy, a, b) -> dx``, the same
bodies the CUDA path compiles): one loop over a span each, so that the loop vectorises. Adding an
activation touches nothing in this file. The backward reads ``saved``: what the row saves, the
*output* where the derivative is a function of it (relu, relu6, sigmoid, tanh), the *input* otherwise.

Each activation's kernels are copies of the four module-level loops below, each copy with its own
globals (``scalar_forward``, ``scalar_backward``, ``forward_span``, ``backward_span``: that row's
functions) and its own name, so that numba's disk cache finds them again in the next process. A
closure would not do: numba keys a cached closure by the pickle of what it captures, and a captured
dispatcher pickles with an id drawn afresh in every process, so every process compiled every
activation again. The name carries a fingerprint of the scalar pair's source (and of ``partition``'s):
numba checks only the freshness of this file, and an edit of a pair in its own file must not load the
kernel compiled from the old body.
"""
import dis
import hashlib
import inspect
import types
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from cpu_ref._misc import flat, partition, run_split
from planner.kernel_table import activation_kernels, activation_kernels_of
from planner.ops import ACTIVATION_SLOTS, OPS, OpRow

_ZERO = np.float32(0.0)


# The loops every activation's kernels are copied from. scalar_forward, scalar_backward, forward_span and
# backward_span are not globals of this module: each copy gets them in its own globals (_copy).

def _forward_span(x, y, a, b, t, nparts):
    lo, hi = partition(x.size, t, nparts)
    x, y = x[lo:hi], y[lo:hi]
    for i in range(x.size):
        y[i] = scalar_forward(x[i], a, b)  # noqa: F821


def _backward_span(s, dy, dx, a, b, accumulate, t, nparts):
    lo, hi = partition(dy.size, t, nparts)
    s, dy, dx = s[lo:hi], dy[lo:hi], dx[lo:hi]
    for i in range(dy.size):
        dx[i] = scalar_backward(s[i], dy[i], a, b) + (dx[i] if accumulate else _ZERO)  # noqa: F821


def _forward_parallel(x, y, a, b, nparts):
    for t in prange(nparts):
        forward_span(x, y, a, b, t, nparts)  # noqa: F821


def _backward_parallel(s, dy, dx, a, b, accumulate, nparts):
    for t in prange(nparts):
        backward_span(s, dy, dx, a, b, accumulate, t, nparts)  # noqa: F821


class _Pointwise(NamedTuple):
    forward: tuple     # (span kernel, parallel kernel), as run_split takes them
    backward: tuple


def pointwise(row: OpRow) -> _Pointwise:
    """The kernels of the activation ``row`` (an op-table row with its scalar pair), one loop each, so no
    code chooses among activations at run time."""
    if not row.activation:
        raise ValueError(f"pointwise({row.prim!r}): expected an activation row of the op table (planner/ops.py "
                         f"activation(...)), got a row with activation=False")
    tag = f"{row.prim.value}_{source_fingerprint(row.scalar_forward, row.scalar_backward, partition.py_func)}"
    pair = {"scalar_forward": njit(inline="always")(row.scalar_forward),
            "scalar_backward": njit(inline="always")(row.scalar_backward)}
    spans = {"forward_span": njit(cache=True)(_copy(_forward_span, tag, pair)),
             "backward_span": njit(cache=True)(_copy(_backward_span, tag, pair))}
    forward_parallel = njit(cache=True, parallel=True)(_copy(_forward_parallel, tag, spans))
    backward_parallel = njit(cache=True, parallel=True)(_copy(_backward_parallel, tag, spans))
    return _Pointwise((spans["forward_span"], forward_parallel), (spans["backward_span"], backward_parallel))


def _copy(loop, tag: str, names: dict):
    """``loop`` with ``names`` added to its globals, named ``<loop>_<tag>``: numba's cache files are named
    after the function, so each activation (and each version of its scalar pair) has its own."""
    name = f"{loop.__name__.lstrip('_')}_{tag}"
    copy = types.FunctionType(loop.__code__, {**globals(), **names}, name)
    copy.__qualname__ = name
    return copy


def source_fingerprint(*functions) -> str:
    """A digest of what kernels compiled from ``functions`` depend on: their source text and the values of
    the module globals they read, which may be numbers (a pair's float32 constants) and modules (by name)."""
    digest = hashlib.sha256()
    for function in functions:
        digest.update(inspect.getsource(function).encode())
        for name in sorted({ins.argval for ins in dis.get_instructions(function) if ins.opname == "LOAD_GLOBAL"}):
            if name in function.__globals__:   # else a builtin (min, max)
                digest.update(f"{name}={_stable_text(function, name)};".encode())
    return digest.hexdigest()[:16]


def _stable_text(function, name) -> str:
    value = function.__globals__[name]
    if inspect.ismodule(value):
        return value.__name__
    if isinstance(value, (int, float, np.generic)):
        return repr(value)
    raise TypeError(f"source_fingerprint: {function.__qualname__} ({inspect.getsourcefile(function)}) reads the global "
                    f"{name!r}, a {type(value).__name__}; expected a number or a module (a scalar body calls only math "
                    f"functions, min and max, and reads np.float32 constants)")


ACTIVATION_KERNELS = activation_kernels(OPS, pointwise)   # Prim -> kernels, every activation row, in table order


def _kernels(prim):
    return activation_kernels_of(ACTIVATION_KERNELS, prim)   # reads the module's table when called


def _slots(params) -> tuple:
    """``params`` (the row's attrs' values, ``planner.ops.activation_params``) as the kernels' float32 slots."""
    return tuple(np.float32(v) for v in tuple(params) + (0.0,) * (ACTIVATION_SLOTS - len(params)))


def activation_forward(prim, x, y, params=()):
    """``y = act(x)`` for the activation ``prim``; ``params``: its parameters in its row's ``attrs`` order."""
    run_split(*_kernels(prim).forward, x.size, flat(x), flat(y), *_slots(params))


def activation_backward(prim, saved, dy, dx, params=(), accumulate=False):
    """``saved`` is what the op table's row saves: the output or the input."""
    if dx is None:
        return
    run_split(*_kernels(prim).backward, dy.size, flat(saved), flat(dy), flat(dx), *_slots(params), accumulate)
