"""The layer registry: one row per primitive kind (a table, not a class hierarchy).

A row holds the shape rule, the parameter specs with their initialisers, the MAC count,
what the backward pass reads (`saves`: the layer's input and/or output value) and the
extra tensors the kind needs (`extras`: saved statistics/indices/masks, workspaces).
Fused kinds have no rows: they are made of primitives (`ArchLayer.sub`) and take their
shapes, parameters and MACs from them (`planner.compiler`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from planner._arch import ACTIVATION_KINDS, ArchLayer

Shape = tuple[int, ...]


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


@dataclass(frozen=True, slots=True)
class KindRule:
    kind: str
    shape: Callable[[ArchLayer, list[Shape]], Shape]
    params: Callable[[ArchLayer, list[Shape]], list[tuple[ParamRule, Shape]]]
    macs: Callable[[ArchLayer, list[Shape], Shape], int]
    saves: tuple[str, ...]                                            # "input" and/or "output"
    extras: Callable[[ArchLayer, list[Shape], Shape], list[tuple[Extra, Shape]]]
    train_only_extras: bool = True  # False: eval graphs plan the saved extras too, as forward workspaces


REGISTRY: dict[str, KindRule] = {}


def register(rule: KindRule) -> None:
    REGISTRY[rule.kind] = rule


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


register(KindRule("conv", _conv_shape, _conv_params, _conv_macs, ("input",), _conv_extras))


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


for _kind in ("bn2d", "bn1d"):
    register(KindRule(_kind, _same, _bn_params, _zero, ("input",), _bn_extras))

# ---- activations ------------------------------------------------------------------------------
ACTIVATION_SAVES_OUTPUT = frozenset({"relu", "relu6", "sigmoid", "tanh"})
ACTIVATION_CODE = {name: code for code, name in enumerate(ACTIVATION_KINDS)}
for _kind in ACTIVATION_KINDS:
    register(KindRule(_kind, _same, _none, _zero, ("output",) if _kind in ACTIVATION_SAVES_OUTPUT else ("input",), _none))

# ---- regularisation, reshapes, sums ------------------------------------------------------------
DROPOUT_MASK = Extra("mask", "uint8", saved=True)
register(KindRule("dropout", _same, _none, _zero, (), lambda layer, shapes, out: [(DROPOUT_MASK, out)]))
register(KindRule("flatten", lambda layer, shapes: (shapes[0][0], math.prod(shapes[0][1:])), _none, _zero, (), _none))


def _add_shape(layer, shapes):
    if shapes[0] != shapes[1]:
        raise ShapeError(f"{layer.path}: add2 branches have different shapes: lhs (shortcut) {shapes[0]}, "
                         f"rhs (main) {shapes[1]} (NHWC); make the shortcut match the main branch's stride and channels")
    return shapes[0]


register(KindRule("add", _add_shape, _none, _zero, (), _none))


# ---- channel_mul: x (N, H, W, C) * s (N, C), the squeeze-excitation scale; backward reads both inputs ----
def _channel_mul_shape(layer, shapes):
    x, s = shapes
    if len(x) != 4 or s != (x[0], x[3]):
        raise ShapeError(f"{layer.path}: channel_mul multiplies an NHWC tensor by one value per sample and channel; "
                         f"expected a scale of shape {(x[0], x[-1])} for the input {x}, got {s}")
    return x


register(KindRule("channel_mul", _channel_mul_shape, _none, _zero, ("input",), _none))

# ---- drop_path: stochastic depth, one keep flag per sample (saved for backward) -----------------------------
DROP_PATH_MASK = Extra("mask", "uint8", saved=True)
register(KindRule("drop_path", _same, _none, _zero, (),
                  lambda layer, shapes, out: [(DROP_PATH_MASK, (out[0],))]))


def _channel_pad_shape(layer, shapes):
    return shapes[0][:-1] + (layer.param("out_channels"),)


register(KindRule("channel_pad", _channel_pad_shape, _none, _zero, (), _none))

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


register(KindRule("fc", _fc_shape, _fc_params, lambda layer, shapes, out: shapes[0][1] * out[1], ("input",), _none))

# ---- pooling -------------------------------------------------------------------------------------
def _pool_shape(what):
    def shape(layer, shapes):
        oh, ow = window_out(layer, shapes[0], what)
        return (shapes[0][0], oh, ow, shapes[0][3])
    return shape


# the forward kernel writes the argmax in eval graphs too (one kernel for both), so eval plans it as a workspace
ARGMAX = Extra("argmax", "int32", saved=True)
register(KindRule("maxpool", _pool_shape("maxpool"), _none, _zero, (), lambda layer, shapes, out: [(ARGMAX, out)],
                  train_only_extras=False))
register(KindRule("avgpool", _pool_shape("avgpool"), _none, _zero, (), _none))
register(KindRule("gap", lambda layer, shapes: (shapes[0][0], shapes[0][3]), _none, _zero, (), _none))

# ---- the loss head -------------------------------------------------------------------------------
def _loss_shape(layer, shapes):
    if len(shapes[0]) != 2:
        raise ShapeError(f"{layer.path}: softmax-cross-entropy expects (N, classes) logits, got {shapes[0]}")
    return ()


register(KindRule("softmax_ce", _loss_shape, _none, _zero, (), _none))

# kinds whose rule can ask for extra tensors (the others never do, so the compiler skips asking them)
KINDS_WITH_EXTRAS = frozenset(kind for kind, rule in REGISTRY.items() if rule.extras is not _none)
