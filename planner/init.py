"""Initial parameter values for a CompiledPlan, shared by every executor.

torchvision's defaults: convolutions `kaiming_normal_(mode="fan_out", nonlinearity="relu")`,
BN weight 1 / bias 0, running mean 0 / var 1, fully connected layers as `nn.Linear`
(weight and bias uniform in +-1/sqrt(fan_in)). Values are drawn in plan order from one
`numpy.random.Generator(PCG64(seed))`, so a seed fixes every weight on every path.
"""
from __future__ import annotations

import math

import numpy as np


def initial_parameters(plan, seed: int) -> dict[int, np.ndarray]:
    """Tensor id -> initial value (internal layout) for every parameter and BN statistic."""
    rng = np.random.Generator(np.random.PCG64(seed))
    values = {}
    for spec in plan.params:
        if spec.init == "kaiming_normal_fan_out":
            value = rng.standard_normal(spec.shape) * math.sqrt(2.0 / spec.fan_out)
        elif spec.init == "linear_uniform":
            bound = 1.0 / math.sqrt(spec.fan_in)
            value = rng.uniform(-bound, bound, spec.shape)
        elif spec.init == "ones":
            value = np.ones(spec.shape)
        elif spec.init == "zeros":
            value = np.zeros(spec.shape)
        elif spec.init == "prelu_quarter":
            value = np.full(spec.shape, 0.25)
        else:
            raise ValueError(f"parameter {spec.name!r}: unknown initialiser {spec.init!r}")
        values[spec.tensor] = value.astype(plan.tensor(spec.tensor).dtype)   # int64 counters, float32 otherwise
    return values


# (O, H, W, C) <-> (O, C, H, W): a conv weight (OHWI / OIHW), or an fc weight whose features come from
# flattening an (H, W, C) map, read as (out, H, W, C) internally and as (out, C, H, W) by PyTorch
CHANNELS_FIRST = (0, 3, 1, 2)
CHANNELS_LAST = (0, 2, 3, 1)


def _move_channels(spec, value: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """A C-ordered copy of `value` with its channel axis moved as `axes` says (always a copy: for a 1x1
    kernel the moved view is already contiguous, and a view would alias an executor's arena)."""
    value = np.asarray(value)
    if spec.torch_layout == "ohwi":
        return np.array(value.transpose(axes), order="C")
    if spec.torch_layout == "conv1x1":   # an se projection: (out, in) here, (out, in, 1, 1) in PyTorch
        return np.array(value.reshape(value.shape[:2] + ((1, 1) if axes == CHANNELS_FIRST else ())), order="C")
    if spec.torch_layout == "fc_hwc" and len(spec.flatten_from) == 3:
        h, w, c = spec.flatten_from
        blocks = value.reshape(-1, h, w, c) if axes == CHANNELS_FIRST else value.reshape(-1, c, h, w)
        return np.array(blocks.transpose(axes), order="C").reshape(value.shape[0], -1)
    return value.copy()


def to_torch_layout(spec, value: np.ndarray) -> np.ndarray:
    """Internal layout -> PyTorch's (conv OHWI -> OIHW; fc features HWC -> CHW)."""
    return _move_channels(spec, value, CHANNELS_FIRST)


def from_torch_layout(spec, value: np.ndarray) -> np.ndarray:
    """PyTorch's layout -> internal (the inverse of `to_torch_layout`)."""
    return _move_channels(spec, value, CHANNELS_LAST)


def torch_shape(spec) -> tuple[int, ...]:
    if spec.torch_layout == "ohwi":
        return tuple(spec.shape[axis] for axis in CHANNELS_FIRST)
    if spec.torch_layout == "conv1x1":
        return tuple(spec.shape) + (1, 1)
    return tuple(spec.shape)
