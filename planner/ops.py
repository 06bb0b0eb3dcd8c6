"""The op table: one row per primitive kind (a table, not a class hierarchy).

`Prim` names every primitive once; its values are the strings the plans carry (`layer.kind`
compares equal to them). A row (`OpRow`) holds what the planner needs and what the paths are
tested against: the `ArchLayer` params it reads, the shape rule, the parameter specs with
their initialisers and PyTorch layouts, the MAC count, what the backward pass reads (`saves`:
the layer's input and/or output value), the extra tensors the kind needs (`extras`: saved
statistics/indices/masks, workspaces), the directions a plan schedules for it, and its numpy
reference forward and backward (`planner.reference`), which are the spec; an activation's row
also names its float32 scalar pair (`planner.scalar_activations`), from which both paths generate
their kernels.
Fused kinds have no rows: they are made of primitives (`ArchLayer.sub`) and take their
shapes, parameters and MACs from them (`planner.compiler`). Each execution path registers
its kernels against `Prim` in its own package (`planner.kernel_table`).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable

from planner import reference as R
from planner import scalar_activations as S

Shape = tuple[int, ...]
ArchLayer = Any   # a planner._arch.ArchLayer, not imported: planner._arch reads this table (PARAMETER_KINDS)


class ShapeError(ValueError):
    """A shape problem found by shape inference; the message names the layer's DSL path."""


@dataclass(frozen=True, slots=True)
class ParamRule:
    suffix: str          # "weight", "bias", "running_mean", ...
    region: str          # "params" (trainable) or "bn_stats"
    init: str            # see planner.init
    torch_layout: str = ""  # "ohwi" conv weights; "fc" may need a CHW feature permutation


@dataclass(frozen=True, slots=True)
class Extra:
    role: str            # name the kernels know it by ("argmax", "mask", "save_mean", "col", ...)
    dtype: str           # "float32", "int32", "uint8", or "act" (the activation dtype)
    saved: bool          # True: written in forward, read in backward; False: per-op workspace
    phases: str = "fb"   # workspaces only: "f" forward, "b" backward, "fb" one each


class Prim(enum.StrEnum):
    """Every primitive kind. A value is the kind's one spelling, in plans and everywhere else."""

    CONV = "conv"
    BN2D = "bn2d"
    BN1D = "bn1d"
    RELU = "relu"
    RELU6 = "relu6"
    LEAKY_RELU = "leaky_relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    SILU = "silu"
    HARDSWISH = "hardswish"
    GELU = "gelu"
    HARDSIGMOID = "hardsigmoid"
    ELU = "elu"
    CELU = "celu"
    SELU = "selu"
    SOFTPLUS = "softplus"
    MISH = "mish"
    PRELU = "prelu"
    HARDTANH = "hardtanh"
    DROPOUT = "dropout"
    DROP_PATH = "drop_path"
    FLATTEN = "flatten"
    FC = "fc"
    MAXPOOL = "maxpool"
    AVGPOOL = "avgpool"
    GAP = "gap"
    CHANNEL_PAD = "channel_pad"
    ADD = "add"
    CHANNEL_MUL = "channel_mul"
    SOFTMAX_CE = "softmax_ce"

    @property
    def row(self) -> "OpRow":
        return OPS[self]


TRAIN = ("forward", "backward")   # the directions a plan schedules for a layer
LOSS = ("loss",)                  # the loss head: one op computes the loss and the logits' gradient


@dataclass(frozen=True, slots=True)
class OpRow:
    prim: Prim
    attrs: tuple[str, ...]       # the `ArchLayer.params` names the kind reads (sorted, as the expander emits them)
    shape: Callable[[ArchLayer, list[Shape]], Shape]
    params: Callable[[ArchLayer, list[Shape]], list[tuple[ParamRule, Shape]]]
    macs: Callable[[ArchLayer, list[Shape], Shape], int]
    saves: tuple[str, ...]                                            # "input" and/or "output"
    extras: Callable[[ArchLayer, list[Shape], Shape], list[tuple[Extra, Shape]]]
    reference_forward: Callable   # planner.reference: the spec of every path's forward ...
    reference_backward: Callable  # ... and backward (for the loss head, one function gives both)
    directions: tuple[str, ...] = TRAIN
    activation: bool = False      # pointwise f(x, alpha) with a reference pair (f, grad) of that form
    train_only_extras: bool = True  # False: eval graphs plan the saved extras too, as forward workspaces
    inputs: tuple[str, ...] = ("x",)  # the operand roles (planner.plan.Role values) of its inputs, in order;
                                      # each input's gradient role is "d" + its role
    scalar_forward: Callable | None = None   # activations: the float32 scalar pair (planner.scalar_activations)
    scalar_backward: Callable | None = None  # that both paths compile into their kernels


_ROWS: dict[Prim, OpRow] = {}


def register(row: OpRow) -> None:
    if row.prim in _ROWS:
        raise ValueError(f"planner/ops.py: a second row for {row.prim.value!r}; each kind has exactly one row")
    if row.activation != (row.scalar_forward is not None and row.scalar_backward is not None):
        raise ValueError(f"planner/ops.py: the row of {row.prim.value!r} has activation={row.activation} but scalar pair "
                         f"({row.scalar_forward}, {row.scalar_backward}); an activation row names its pair in "
                         f"planner/scalar_activations.py, any other row none")
    _ROWS[row.prim] = row


def _none(*_):
    return []


def _zero(*_):
    return 0


def _same(layer: ArchLayer, shapes: list[Shape]) -> Shape:
    return shapes[0]


def window_out(layer: ArchLayer, shape: Shape, what: str) -> tuple[int, int]:
    k, s, p = layer.param("kernel"), layer.param("stride"), layer.param("padding")
    n, h, w, c = shape
    if h + 2 * p < k or w + 2 * p < k:
        raise ShapeError(f"{layer.path}: {what} with kernel {k}x{k} (stride {s}, padding {p}) needs a spatial size "
                         f"of at least {k - 2 * p}x{k - 2 * p}, but its input is {shape} (NHWC); use a smaller "
                         f"kernel or a larger input")
    return (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1


def _check_channels(layer: ArchLayer, shape: Shape) -> None:
    if layer.in_channels >= 0 and shape[-1] != layer.in_channels:
        raise ShapeError(f"{layer.path}: expected an input with {layer.in_channels} channels, got shape {shape}")


# ---- convolution --------------------------------------------------------------------------
def _conv_shape(layer, shapes):
    _check_channels(layer, shapes[0])
    oh, ow = window_out(layer, shapes[0], "conv")
    return (shapes[0][0], oh, ow, layer.param("out_channels"))


CONV_WEIGHT = ParamRule("weight", "params", "kaiming_normal_fan_out", "ohwi")
COL = Extra("col", "act", saved=False)
# not a row's: under AMP the planner gives a groups-1 convolution with Cin % 8 != 0 its input zero-padded to a
# multiple of 8 channels (forward; backward: then its padded input gradient), schedule.padded_input_workspaces
X_PADDED = Extra("x_padded", "act", saved=False)


def _conv_params(layer, shapes):
    k, g = layer.param("kernel"), layer.param("groups")
    shape = (layer.param("out_channels"), k, k, shapes[0][-1] // g)
    return [(CONV_WEIGHT, shape)]


def _conv_macs(layer, shapes, out):
    k, g = layer.param("kernel"), layer.param("groups")
    return out[1] * out[2] * out[3] * k * k * (shapes[0][-1] // g)


def conv_needs_col(layer: ArchLayer, in_channels: int) -> bool:
    param = dict(layer.params)
    k, s, p, g = param["kernel"], param["stride"], param["padding"], param["groups"]
    depthwise = g == in_channels == param["out_channels"] and g > 1
    return not depthwise and not (k == 1 and s == 1 and p == 0 and g == 1)


def _conv_extras(layer, shapes, out):
    if not conv_needs_col(layer, shapes[0][-1]):
        return []
    k, g = layer.param("kernel"), layer.param("groups")
    col = (out[0] * out[1] * out[2], k * k * (shapes[0][-1] // g))
    return [(COL, col)]


register(OpRow(Prim.CONV, ("groups", "kernel", "out_channels", "padding", "stride"), _conv_shape, _conv_params,
             _conv_macs, ("input",), _conv_extras, R.conv2d_forward, R.conv2d_backward))


# ---- batch norm (2-D and 1-D share the kernels) ----------------------------------------------
BN_PARAMS = (ParamRule("weight", "params", "ones"), ParamRule("bias", "params", "zeros"),
             ParamRule("running_mean", "bn_stats", "zeros"), ParamRule("running_var", "bn_stats", "ones"))
BN_TRACKED = ParamRule("num_batches_tracked", "bn_stats", "zeros")
BN_SAVED = (Extra("save_mean", "float32", saved=True), Extra("save_invstd", "float32", saved=True))


def _bn_params(layer, shapes):
    c = (shapes[0][-1],)
    return [(rule, c) for rule in BN_PARAMS] + [(BN_TRACKED, ())]


def _bn_extras(layer, shapes, out):
    c = (shapes[0][-1],)
    return [(extra, c) for extra in BN_SAVED]


for _prim in (Prim.BN2D, Prim.BN1D):
    register(OpRow(_prim, ("eps", "momentum"), _same, _bn_params, _zero, ("input",), _bn_extras,
                   R.batchnorm_forward_train, R.batchnorm_backward))

# ---- activations ------------------------------------------------------------------------------
ACTIVATION_SLOTS = 2   # the scalar parameters an activation's kernels take (its row's attrs, in order)


def activation_params(layer: ArchLayer) -> tuple[float, ...]:
    """The values of ``layer``'s activation parameters, in its row's ``attrs`` order, padded with zeros to
    ``ACTIVATION_SLOTS``: what every path passes to the kernels compiled from the row's scalar pair."""
    values = [float(layer.param(name)) for name in OPS[layer.kind].attrs]
    return tuple(values) + (0.0,) * (ACTIVATION_SLOTS - len(values))


def activation(prim: Prim, saves: str, forward: Callable, backward: Callable, scalar_forward: Callable,
               scalar_backward: Callable, attrs: tuple[str, ...] = ()) -> None:
    """A pointwise activation row. ``saves``: "output" where the derivative is a function of the output
    (the input need not be kept), else "input"; ``forward``/``backward``: the numpy reference pair (the spec);
    ``scalar_forward``/``scalar_backward``: the float32 pair both paths compile into their kernels;
    ``attrs``: its scalar parameters (at most ``ACTIVATION_SLOTS``), passed to both pairs in this order."""
    if len(attrs) > ACTIVATION_SLOTS:
        raise ValueError(f"planner/ops.py: the activation {prim.value!r} has {len(attrs)} parameters {attrs}; the "
                         f"activation kernels carry {ACTIVATION_SLOTS} (ACTIVATION_SLOTS)")
    register(OpRow(prim, attrs, _same, _none, _zero, (saves,), _none, forward, backward, activation=True,
                   scalar_forward=scalar_forward, scalar_backward=scalar_backward))


activation(Prim.RELU, "output", R.relu, R.relu_grad, S.relu, S.relu_grad)
activation(Prim.RELU6, "output", R.relu6, R.relu6_grad, S.relu6, S.relu6_grad)
activation(Prim.LEAKY_RELU, "input", R.leaky_relu, R.leaky_relu_grad, S.leaky_relu, S.leaky_relu_grad,
           attrs=("slope",))
activation(Prim.SIGMOID, "output", R.sigmoid, R.sigmoid_grad, S.sigmoid, S.sigmoid_grad)
activation(Prim.TANH, "output", R.tanh, R.tanh_grad, S.tanh, S.tanh_grad)
activation(Prim.SILU, "input", R.silu, R.silu_grad, S.silu, S.silu_grad)
activation(Prim.HARDSWISH, "input", R.hardswish, R.hardswish_grad, S.hardswish, S.hardswish_grad)
activation(Prim.GELU, "input", R.gelu, R.gelu_grad, S.gelu, S.gelu_grad)
activation(Prim.HARDSIGMOID, "input", R.hardsigmoid, R.hardsigmoid_grad, S.hardsigmoid, S.hardsigmoid_grad)
activation(Prim.ELU, "input", R.elu, R.elu_grad, S.elu, S.elu_grad, attrs=("alpha",))
activation(Prim.CELU, "input", R.celu, R.celu_grad, S.celu, S.celu_grad, attrs=("alpha",))
activation(Prim.SELU, "input", R.selu, R.selu_grad, S.selu, S.selu_grad)
activation(Prim.SOFTPLUS, "input", R.softplus, R.softplus_grad, S.softplus, S.softplus_grad,
           attrs=("beta", "threshold"))
activation(Prim.MISH, "input", R.mish, R.mish_grad, S.mish, S.mish_grad)
activation(Prim.HARDTANH, "input", R.hardtanh, R.hardtanh_grad, S.hardtanh, S.hardtanh_grad,
           attrs=("max_val", "min_val"))

# ---- prelu: a learnable negative slope, one per channel (the last axis) or one shared -------------------
PRELU_WEIGHT = ParamRule("weight", "params", "prelu_quarter")   # torch.nn.PReLU's init=0.25


def _prelu_params(layer, shapes):
    count = layer.param("num_parameters")
    if count not in (1, shapes[0][-1]):
        raise ShapeError(f"{layer.path}: prelu({count}) has {count} slopes for an input of {shapes[0][-1]} channels "
                         f"(shape {shapes[0]}); use prelu(1) (one shared slope) or prelu({shapes[0][-1]})")
    return [(PRELU_WEIGHT, (count,))]


register(OpRow(Prim.PRELU, ("num_parameters",), _same, _prelu_params, _zero, ("input",), _none, R.prelu_forward,
               R.prelu_backward))

# ---- regularisation, reshapes, sums ------------------------------------------------------------
DROPOUT_MASK = Extra("mask", "uint8", saved=True)
register(OpRow(Prim.DROPOUT, ("p",), _same, _none, _zero, (), lambda layer, shapes, out: [(DROPOUT_MASK, out)],
             R.dropout_forward, R.dropout_backward))
register(OpRow(Prim.FLATTEN, (), lambda layer, shapes: (shapes[0][0], math.prod(shapes[0][1:])), _none, _zero, (),
             _none, R.flatten_forward, R.flatten_backward))


def _add_shape(layer, shapes):
    if shapes[0] != shapes[1]:
        raise ShapeError(f"{layer.path}: add2 branches have different shapes: lhs (shortcut) {shapes[0]}, "
                         f"rhs (main) {shapes[1]} (NHWC); make the shortcut match the main branch's stride and channels")
    return shapes[0]


register(OpRow(Prim.ADD, (), _add_shape, _none, _zero, (), _none, R.add_forward, R.add_backward, inputs=("a", "b")))


# ---- channel_mul: x (N, H, W, C) * s (N, C), the squeeze-excitation scale; backward reads both inputs ----
def _channel_mul_shape(layer, shapes):
    x, s = shapes
    if len(x) != 4 or s != (x[0], x[3]):
        raise ShapeError(f"{layer.path}: channel_mul multiplies an NHWC tensor by one value per sample and channel; "
                         f"expected a scale of shape {(x[0], x[-1])} for the input {x}, got {s}")
    return x


register(OpRow(Prim.CHANNEL_MUL, (), _channel_mul_shape, _none, _zero, ("input",), _none, R.channel_mul_forward,
               R.channel_mul_backward, inputs=("x", "s")))

# ---- drop_path: stochastic depth, one keep flag per sample (saved for backward) -----------------------------
DROP_PATH_MASK = Extra("mask", "uint8", saved=True)
register(OpRow(Prim.DROP_PATH, ("p",), _same, _none, _zero, (), lambda layer, shapes, out: [(DROP_PATH_MASK, (out[0],))],
               R.drop_path_forward, R.drop_path_backward))


def _channel_pad_shape(layer, shapes):
    return shapes[0][:-1] + (layer.param("out_channels"),)


register(OpRow(Prim.CHANNEL_PAD, ("out_channels",), _channel_pad_shape, _none, _zero, (), _none,
             R.channel_pad_forward, R.channel_pad_backward))

# ---- fully connected -----------------------------------------------------------------------------
def _fc_shape(layer, shapes):
    if len(shapes[0]) != 2:
        raise ShapeError(f"{layer.path}: fc expects (N, features), got {shapes[0]}")
    _check_channels(layer, shapes[0])
    return (shapes[0][0], layer.param("out_features"))


FC_WEIGHT = ParamRule("weight", "params", "linear_uniform", "fc")
FC_BIAS = ParamRule("bias", "params", "linear_uniform")


def _fc_params(layer, shapes):
    out, features = layer.param("out_features"), shapes[0][1]
    rules = [(FC_WEIGHT, (out, features))]
    if layer.param("bias"):
        rules.append((FC_BIAS, (out,)))
    return rules


register(OpRow(Prim.FC, ("bias", "out_features"), _fc_shape, _fc_params,
             lambda layer, shapes, out: shapes[0][1] * out[1], ("input",), _none, R.linear_forward, R.linear_backward))

# ---- pooling -------------------------------------------------------------------------------------
def _pool_shape(what):
    def shape(layer, shapes):
        oh, ow = window_out(layer, shapes[0], what)
        return (shapes[0][0], oh, ow, shapes[0][3])
    return shape


# the forward kernel writes the argmax in eval graphs too (one kernel for both), so eval plans it as a workspace
ARGMAX = Extra("argmax", "int32", saved=True)
WINDOW = ("kernel", "padding", "stride")
register(OpRow(Prim.MAXPOOL, WINDOW, _pool_shape("maxpool"), _none, _zero, (),
               lambda layer, shapes, out: [(ARGMAX, out)], R.maxpool_forward, R.maxpool_backward,
               train_only_extras=False))
register(OpRow(Prim.AVGPOOL, WINDOW, _pool_shape("avgpool"), _none, _zero, (), _none, R.avgpool_forward,
               R.avgpool_backward))
register(OpRow(Prim.GAP, (), lambda layer, shapes: (shapes[0][0], shapes[0][3]), _none, _zero, (), _none,
               R.gap_forward, R.gap_backward))

# ---- the loss head -------------------------------------------------------------------------------
def _loss_shape(layer, shapes):
    if len(shapes[0]) != 2:
        raise ShapeError(f"{layer.path}: softmax-cross-entropy expects (N, classes) logits, got {shapes[0]}")
    return ()


register(OpRow(Prim.SOFTMAX_CE, (), _loss_shape, _none, _zero, (), _none, R.softmax_cross_entropy,
               R.softmax_cross_entropy, directions=LOSS))

missing = [prim.value for prim in Prim if prim not in _ROWS]
if missing:
    raise AssertionError(f"planner/ops.py: Prim members without a row: {missing}; register a row for each")

OPS = MappingProxyType({prim: _ROWS[prim] for prim in Prim})    # Prim -> OpRow, frozen, in Prim order
ACTIVATIONS = tuple(prim for prim, row in OPS.items() if row.activation)
PARAMETER_KINDS = frozenset(prim for prim, row in OPS.items() if row.params is not _none)
# one input, output of the input's shape: the expander emits these generically from a DSL leaf of the same name
SHAPE_PRESERVING = frozenset(prim for prim, row in OPS.items() if row.shape is _same and row.directions == TRAIN)
# kinds whose row can ask for extra tensors (the others never do, so the compiler skips asking them)
KINDS_WITH_EXTRAS = frozenset(prim for prim, row in OPS.items() if row.extras is not _none)
