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
        else:
            raise ValueError(f"parameter {spec.name!r}: unknown initialiser {spec.init!r}")
        values[spec.tensor] = value.astype(np.int64 if spec.name.endswith("num_batches_tracked") else np.float32)
    return values


def to_torch_layout(spec, value: np.ndarray) -> np.ndarray:
    """Internal layout -> PyTorch's (conv OHWI -> OIHW; fc features HWC -> CHW)."""
    if spec.torch_layout == "ohwi":
        return np.ascontiguousarray(value.transpose(0, 3, 1, 2))
    if spec.torch_layout == "fc_hwc" and len(spec.flatten_from) == 3:
        h, w, c = spec.flatten_from
        return np.ascontiguousarray(value.reshape(-1, h, w, c).transpose(0, 3, 1, 2).reshape(value.shape[0], -1))
    return value.copy()


def from_torch_layout(spec, value: np.ndarray) -> np.ndarray:
    """PyTorch's layout -> internal (the inverse of `to_torch_layout`)."""
    if spec.torch_layout == "ohwi":
        return np.ascontiguousarray(value.transpose(0, 2, 3, 1))
    if spec.torch_layout == "fc_hwc" and len(spec.flatten_from) == 3:
        h, w, c = spec.flatten_from
        return np.ascontiguousarray(value.reshape(-1, c, h, w).transpose(0, 2, 3, 1).reshape(value.shape[0], -1))
    return np.array(value)


def torch_shape(spec) -> tuple[int, ...]:
    if spec.torch_layout == "ohwi":
        o, kh, kw, i = spec.shape
        return (o, i, kh, kw)
    return tuple(spec.shape)
