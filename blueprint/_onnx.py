"""ONNX export of a Model's eval graph, built with the `onnx` package from the plan's eval schedule.

The boundary is NCHW, as ONNX consumers expect: input ``input`` float32 (N, C, H, W), already
normalised (``(pixel / divisor - mean) / std``; the values are in the model's metadata under
``blueprint.input``), output ``logits`` float32 (N, classes). The weights are the PyTorch-layout
state dict (conv OIHW, fc features in C, H, W order), so the graph is the one a torchvision
export would give. Opset 17; the batch axis is dynamic unless a batch size is given.

The exporter is a path like the executors: it registers one node builder per primitive kind in its
kernel table (`ONNX`, direction "forward"); `build_onnx` checks the plan against it first, so a kind
without a builder is refused naming it and this file.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from planner.kernel_table import KernelTable
from planner.ops import Prim
from planner.plan import Role

OPSET = 17
IR_VERSION = 8          # the IR version of opset 17: readable by every runtime that runs opset 17
INPUT, OUTPUT = "input", "logits"
BATCH_AXIS = "batch"


ONNX = KernelTable("onnx", lambda prim: "blueprint/_onnx.py", directions=("forward", "loss"))
ONNX.not_on_path(Prim.SOFTMAX_CE, "loss", "the exported graph ends at the logits; the loss is computed by the caller")


class _Graph:
    """Nodes and initialisers being built; ONNX names of the plan's tensors as the schedule runs."""

    def __init__(self, plan, weights):
        self.plan, self.nodes, self.initializers = plan, [], []
        self.names = {plan.io["input"]: INPUT}
        self.param_names = {p.tensor: p.name for p in plan.params}
        self.layouts = {p.tensor: p.torch_layout for p in plan.params}
        self.weights, self.added = weights, set()

    def input(self, op, role=Role.X) -> str:
        return self.names[op.read(role)]

    def param(self, op, role) -> str:
        name = self.param_names[op.read(role)]
        if name not in self.added:     # a parameter read by two ops is stored once
            from onnx import numpy_helper
            self.added.add(name)
            self.initializers.append(numpy_helper.from_array(np.asarray(self.weights[name], np.float32), name))
        return name

    def constant(self, name: str, value) -> str:
        from onnx import numpy_helper
        self.initializers.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def constant_int64(self, name: str, value) -> str:
        from onnx import numpy_helper
        self.initializers.append(numpy_helper.from_array(np.asarray(value, np.int64), name))
        return name

    def node(self, kind: str, inputs: list[str], output: str, **attrs) -> str:
        from onnx import helper
        self.nodes.append(helper.make_node(kind, inputs, [output], name=output, **attrs))
        return output

    def output(self, op, name: str) -> None:
        self.names[op.written(Role.Y)] = name


def _window(layer) -> dict:
    k, s, p = layer.param("kernel"), layer.param("stride"), layer.param("padding")
    return {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4}


@ONNX.implements(Prim.CONV, "forward")
def _conv(g, layer, op, out):
    window = _window(layer)
    return g.node("Conv", [g.input(op), g.param(op, Role.WEIGHT)], out, group=layer.param("groups"),
                  dilations=[1, 1], **window)


@ONNX.implements((Prim.BN2D, Prim.BN1D), "forward")
def _bn(g, layer, op, out):
    params = [g.param(op, role) for role in (Role.WEIGHT, Role.BIAS, Role.RUNNING_MEAN, Role.RUNNING_VAR)]
    return g.node("BatchNormalization", [g.input(op)] + params, out, epsilon=float(layer.param("eps")))


def _simple(kind):
    return lambda g, layer, op, out: g.node(kind, [g.input(op)], out)


def _with_attrs(kind):
    """One node whose attributes are the kind's op-table attrs, by the same names (elu's ``alpha``)."""
    return lambda g, layer, op, out: g.node(kind, [g.input(op)], out,
                                            **{name: float(value) for name, value in layer.params})


@ONNX.implements(Prim.RELU6, "forward")
def _relu6(g, layer, op, out):
    return g.node("Clip", [g.input(op), g.constant(out + ".min", 0.0), g.constant(out + ".max", 6.0)], out)


@ONNX.implements(Prim.LEAKY_RELU, "forward")
def _leaky_relu(g, layer, op, out):
    return g.node("LeakyRelu", [g.input(op)], out, alpha=float(layer.param("slope")))


@ONNX.implements(Prim.SOFTPLUS, "forward")
def _softplus(g, layer, op, out):
    """ONNX's Softplus has no beta or threshold: Where(beta x > threshold, x, Softplus(beta x) / beta)."""
    x, beta = g.input(op), g.constant(out + ".beta", layer.param("beta"))
    scaled = g.node("Mul", [x, beta], out + ".scaled")
    smooth = g.node("Div", [g.node("Softplus", [scaled], out + ".softplus"), beta], out + ".smooth")
    linear = g.node("Greater", [scaled, g.constant(out + ".threshold", layer.param("threshold"))], out + ".linear")
    return g.node("Where", [linear, x, smooth], out)


@ONNX.implements(Prim.HARDTANH, "forward")
def _hardtanh(g, layer, op, out):
    low, high = g.constant(out + ".min", layer.param("min_val")), g.constant(out + ".max", layer.param("max_val"))
    return g.node("Clip", [g.input(op), low, high], out)


@ONNX.implements(Prim.MISH, "forward")
def _mish(g, layer, op, out):
    """x tanh(softplus(x)) (ONNX's Mish op needs opset 18)."""
    x = g.input(op)
    return g.node("Mul", [x, g.node("Tanh", [g.node("Softplus", [x], out + ".softplus")], out + ".tanh")], out)


@ONNX.implements(Prim.PRELU, "forward")
def _prelu(g, layer, op, out):
    """PRelu with the slopes shaped to broadcast on the NCHW channel axis ((C, 1, 1), or (C,) after a flatten)."""
    rank = len(g.plan.tensor(op.read(Role.X)).shape)
    slope = g.node("Reshape", [g.param(op, Role.WEIGHT), g.constant_int64(out + ".shape", [-1] + [1] * (rank - 2))],
                   out + ".slope")
    return g.node("PRelu", [g.input(op), slope], out)


@ONNX.implements(Prim.SILU, "forward")
def _silu(g, layer, op, out):
    return g.node("Mul", [g.input(op), g.node("Sigmoid", [g.input(op)], out + ".sigmoid")], out)


@ONNX.implements(Prim.GELU, "forward")
def _gelu(g, layer, op, out):
    """0.5 x (1 + erf(x / sqrt 2)), the exact GELU (ONNX's Gelu op needs opset 20)."""
    x = g.input(op)
    erf = g.node("Erf", [g.node("Mul", [x, g.constant(out + ".rsqrt2", 1 / math.sqrt(2))], out + ".scaled")],
                 out + ".erf")
    half_x = g.node("Mul", [x, g.constant(out + ".half", 0.5)], out + ".half_x")
    return g.node("Mul", [half_x, g.node("Add", [erf, g.constant(out + ".one", 1.0)], out + ".cdf2")], out)


@ONNX.implements(Prim.FC, "forward")
def _fc(g, layer, op, out):
    weight = g.param(op, Role.WEIGHT)
    if g.layouts[op.read(Role.WEIGHT)] == "conv1x1":   # an se projection: its PyTorch weight is (out, in, 1, 1)
        weight = g.node("Flatten", [weight], out + ".weight2d", axis=1)
    bias = [g.param(op, Role.BIAS)] if op.read(Role.BIAS) is not None else []
    return g.node("Gemm", [g.input(op), weight] + bias, out, transB=1)


@ONNX.implements(Prim.HARDSIGMOID, "forward")
def _hardsigmoid(g, layer, op, out):
    """PyTorch's relu6(x + 3) / 6; ONNX's HardSigmoid defaults to alpha=0.2, so both are given."""
    return g.node("HardSigmoid", [g.input(op)], out, alpha=1.0 / 6.0, beta=0.5)


@ONNX.implements(Prim.CHANNEL_MUL, "forward")
def _channel_mul(g, layer, op, out):
    """x (N, C, H, W) * s (N, C) -> s unsqueezed to (N, C, 1, 1), broadcast."""
    from onnx import numpy_helper
    g.initializers.append(numpy_helper.from_array(np.asarray([2, 3], np.int64), out + ".axes"))
    scale = g.node("Unsqueeze", [g.input(op, Role.S), out + ".axes"], out + ".scale")
    return g.node("Mul", [g.input(op), scale], out)


@ONNX.implements(Prim.FLATTEN, "forward")
def _flatten(g, layer, op, out):
    return g.node("Flatten", [g.input(op)], out, axis=1)


@ONNX.implements(Prim.MAXPOOL, "forward")
def _maxpool(g, layer, op, out):
    return g.node("MaxPool", [g.input(op)], out, **_window(layer))


@ONNX.implements(Prim.AVGPOOL, "forward")
def _avgpool(g, layer, op, out):
    return g.node("AveragePool", [g.input(op)], out, count_include_pad=1, **_window(layer))


@ONNX.implements(Prim.GAP, "forward")
def _gap(g, layer, op, out):
    return g.node("Flatten", [g.node("GlobalAveragePool", [g.input(op)], out + ".pooled")], out, axis=1)


@ONNX.implements(Prim.CHANNEL_PAD, "forward")
def _channel_pad(g, layer, op, out):
    from onnx import numpy_helper
    shape = g.plan.tensor(op.read(Role.X)).shape              # the plan's NHWC (or (N, F)) shape
    extra = layer.param("out_channels") - shape[-1]
    pads = [0, 0, 0, extra] if len(shape) == 2 else [0, 0, 0, 0, 0, extra, 0, 0]   # channel axis 1 in NCHW
    g.initializers.append(numpy_helper.from_array(np.asarray(pads, np.int64), out + ".pads"))
    return g.node("Pad", [g.input(op), out + ".pads"], out)


@ONNX.implements(Prim.ADD, "forward")
def _add(g, layer, op, out):
    return g.node("Add", [g.input(op, Role.A), g.input(op, Role.B)], out)


for _prim, _node in ((Prim.RELU, "Relu"), (Prim.SIGMOID, "Sigmoid"), (Prim.TANH, "Tanh"),
                     (Prim.HARDSWISH, "HardSwish"), (Prim.SELU, "Selu"), (Prim.DROPOUT, "Identity"),
                     (Prim.DROP_PATH, "Identity")):   # one ONNX node of the same name
    ONNX.register(_prim, "forward", _simple(_node))
for _prim, _node in ((Prim.ELU, "Elu"), (Prim.CELU, "Celu")):   # one node, the same attribute names
    ONNX.register(_prim, "forward", _with_attrs(_node))


def build_onnx(model, batch: int | None = None):
    """The `onnx.ModelProto` of ``model``'s eval graph (checked with `onnx.checker`)."""
    try:
        import onnx
        from onnx import TensorProto, helper
    except ImportError as error:
        raise ImportError(f"ONNX export needs the onnx package: pip install \".[onnx]\" "
                          f"in the blueprint-nn source tree ({error})") from error
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ValueError(f"export_onnx(batch=...): expected a positive int or None (dynamic), got {batch!r}")
    plan = model.eval_plan(1)
    ONNX.check_plan(plan, ("forward",))   # the loss op is not exported (see ONNX.not_on_path above)
    g = _Graph(plan, model.state_dict())
    for op in plan.graphs["eval"].ops:
        if op.direction != "forward":
            continue
        layer = plan.arch.layers[op.layer]
        g.output(op, ONNX.lookup(layer.kind, "forward", layer.path)(g, layer, op, f"{layer.name}.{op.index}"))
    logits = plan.io["logits"]
    if logits not in g.names:
        raise NotImplementedError(f"ONNX export: the eval schedule never writes the logits tensor {logits}")
    g.node("Identity", [g.names[logits]], OUTPUT)
    h, w, c = model.spec.sample_shape
    n = BATCH_AXIS if batch is None else batch
    graph = helper.make_graph(g.nodes, model.blueprint.name or "blueprint",
                              [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, [n, c, h, w])],
                              [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, [n, model.classes])],
                              g.initializers)
    proto = helper.make_model(graph, producer_name="blueprint-nn", opset_imports=[helper.make_opsetid("", OPSET)])
    proto.ir_version = IR_VERSION
    helper.set_model_props(proto, {"blueprint.input": json.dumps(model.spec.as_state()),
                                   "blueprint.model": repr(model.blueprint)})
    onnx.checker.check_model(proto, full_check=True)
    return proto


def export_onnx(model, path, batch: int | None = None) -> Path:
    """Write ``model``'s eval graph to ``path`` (see the module docstring for the boundary)."""
    proto = build_onnx(model, batch)   # first: it says which extra to install when onnx is missing
    import onnx
    path = Path(path)
    onnx.save(proto, str(path))
    return path
