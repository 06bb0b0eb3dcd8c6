"""`Compiler(arch).compile(variants=...)`: five named phases from an ArchPlan to a CompiledPlan.

    infer_shapes    concrete NHWC shapes of every value, per variant; parameter shapes
    build_graphs    the op schedules (train: forward, loss, backward, optimizer; eval: forward,
                    loss) over tensor ids, with each tensor's shape in each variant
    size_slot       every tensor slot gets the largest size over the variants of its graph (applied
                    by build_graphs to each tensor it makes)
    plan_memory     persistent regions laid out once; saved and transient tensors get offsets
                    from their lifetimes over the schedule (planner.memory)
    share_variants  variants of one graph share its schedule and offsets; equal shapes share
                    one shape signature (the key for captured CUDA graphs)

A variant's graph is `train` when its name starts with "train" (and training=True), else `eval`.
"""
from __future__ import annotations

import contextlib
import gc
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from planner._arch import FUSED, NETWORK_INPUT, ArchLayer, ArchPlan
from planner.registry import KINDS_WITH_EXTRAS, REGISTRY, ParamRule, Shape, ShapeError

DTYPE_BYTES = {"float32": 4, "float16": 2, "int32": 4, "int64": 8, "uint8": 1}
PERSISTENT_REGIONS = ("params", "weights16", "grads", "optim", "bn_stats", "io", "scalars")
PLANNED_REGIONS = ("saved", "transient")
REGIONS = PERSISTENT_REGIONS + PLANNED_REGIONS
SCALARS = (("loss", "float32"), ("lr", "float32"), ("step", "int64"), ("loss_scale", "float32"),
           ("overflow", "int32"), ("good_steps", "int32"), ("correct", "int32"),
           ("iteration", "int32"))   # iteration: every train step, skipped ones too (dropout draws)


# The records a compile makes by the thousand (ParamSpec, TensorSpec, Op) are named tuples: immutable
# like the plan's frozen dataclasses, copied with `_replace`, and about 4x cheaper to build (a ResNet-152
# compile makes ~930 ParamSpecs, ~3,900 TensorSpecs twice, ~1,500 Ops).
class ParamSpec(NamedTuple):
    name: str
    tensor: int
    shape: Shape
    region: str
    init: str
    layer: int               # index of the primitive in `CompiledPlan.primitives`
    torch_layout: str = ""   # "ohwi": conv weight; "fc_hwc": fc weight whose features come from an NHWC flatten
    flatten_from: Shape = ()  # (H, W, C) for "fc_hwc"
    fan_in: int = 0
    fan_out: int = 0


class TensorSpec(NamedTuple):
    """One tensor of a plan: its slot (the largest shape over the variants that use it), its region and,
    once `plan_memory` has placed it, its byte offset in the arena."""

    id: int
    name: str
    region: str
    dtype: str
    shape: Shape              # the slot's shape (largest variant)
    nbytes: int
    offset: int = -1          # -1 until plan_memory places it
    graph: str = ""           # "" for persistent tensors, else "train" / "eval"
    variant_shapes: tuple = ()  # ((variant, shape), ...) for graph and io tensors

    def shape_in(self, variant: str) -> Shape:
        for name, shape in self.variant_shapes:
            if name == variant:
                return shape
        return self.shape


class Op(NamedTuple):
    index: int                # position in its graph's schedule (shadows tuple.index, which nothing here uses)
    kind: str                 # a registry kind, a fused kind, or "optimizer"
    direction: str            # "forward", "loss", "backward", "optimizer"
    layer: int                # index into arch.layers, -1 for the optimizer
    name: str
    reads: tuple[tuple[str, int], ...]
    writes: tuple[tuple[str, int], ...]
    attrs: tuple[tuple[str, object], ...] = ()

    def read(self, role: str) -> int | None:
        return next((t for r, t in self.reads if r == role), None)

    def written(self, role: str) -> int | None:
        return next((t for r, t in self.writes if r == role), None)

    def attr(self, name: str, default=None):
        return next((v for k, v in self.attrs if k == name), default)


@dataclass(frozen=True, slots=True)
class ComputationGraph:
    name: str
    ops: tuple[Op, ...]
    boundary: int = -1        # index of the first backward op (train graphs)


@dataclass(frozen=True, slots=True)
class VariantPlan:
    name: str
    graph: str
    input_shape: Shape
    signature: tuple          # (graph, input shape); equal signatures share one captured CUDA graph


@dataclass(frozen=True)
class CompiledPlan:
    arch: ArchPlan
    primitives: tuple[ArchLayer, ...]
    variants: dict[str, VariantPlan]
    value_shapes: dict[str, dict[int, Shape]]
    graphs: dict[str, ComputationGraph]
    tensors: tuple[TensorSpec, ...]
    params: tuple[ParamSpec, ...]
    memory: "object"
    io: dict[str, int]                       # "input", "labels", "logits", and scalar names -> tensor id
    macs_per_sample: dict[int, int]          # primitive index -> MACs for one sample
    activation_dtype: str
    training: bool
    optimizer_state_slots: int
    compile_ms: float = 0.0
    layer_values: dict[int, int] = field(default_factory=dict)  # value id -> tensor id (train graph, else eval)

    def tensor(self, tid: int) -> TensorSpec:
        return self.tensors[tid]

    @property
    def params_trainable(self) -> int:
        return sum(math.prod(p.shape) for p in self.params if p.region == "params")

    def verify(self) -> None:
        from planner.verify import verify_plan
        verify_plan(self)


def _primitive_list(arch: ArchPlan) -> list[tuple[int, ArchLayer]]:
    out = []
    for index, layer in enumerate(arch.layers):
        for prim in (layer.sub or (layer,)):
            out.append((index, prim))
    return out


# ---- phase 1 ------------------------------------------------------------------------------------
def infer_shapes(arch: ArchPlan, variants: dict[str, Shape]) -> tuple[dict[str, dict[int, Shape]], dict]:
    """Shapes of every value per variant, and every primitive's parameter shapes (equal across variants)."""
    value_shapes: dict[str, dict[int, Shape]] = {}
    param_shapes: dict[int, list[tuple[ParamRule, Shape]]] = {}
    seen_in: dict[int, tuple[str, Shape]] = {}
    prims = [(REGISTRY[prim.kind], prim) for _, prim in _primitive_list(arch)]
    for variant, shape in variants.items():
        shape = tuple(shape)
        if len(shape) != 4 or any(not isinstance(d, (int, np.integer)) or d < 1 for d in shape):
            raise ShapeError(f"variant {variant!r}: expected an input shape (N, H, W, C) of positive ints, got {shape!r}")
        if shape[3] != arch.in_channels:
            raise ShapeError(f"variant {variant!r}: the plan was expanded for {arch.in_channels} input channels, "
                             f"but the variant's input shape {shape} has {shape[3]}; pass in_channels={shape[3]} "
                             f"to ArchPlan.from_blueprint")
        shapes = {NETWORK_INPUT: shape}
        for position, (rule, prim) in enumerate(prims):
            ins = [shapes[v] for v in prim.inputs]
            shapes[prim.output] = rule.shape(prim, ins)
            params = rule.params(prim, ins)
            if position not in param_shapes:
                param_shapes[position] = params
                seen_in[position] = (variant, ins[0])
            elif params != param_shapes[position]:
                first_variant, first_in = seen_in[position]
                raise ShapeError(f"{prim.path}: parameter shapes differ between variants: {first_variant!r} "
                                 f"(input {first_in}) gives {[s for _, s in param_shapes[position]]}, {variant!r} "
                                 f"(input {ins[0]}) gives {[s for _, s in params]}; variants must agree on every "
                                 f"shape that reaches a parameter (e.g. the features entering an fc)")
        _check_addressable(variant, shape, shapes, param_shapes)
        value_shapes[variant] = shapes
    return value_shapes, param_shapes


#: Bytes one plan may address at most: offsets are int64, and a tensor's bytes, its gradient's and
#: their sum must all stay in range.
LARGEST_ARENA_BYTES = 2**60


def _check_addressable(variant, input_shape, shapes, param_shapes) -> None:
    elements = sum(math.prod(s) for s in shapes.values())
    elements += sum(math.prod(s) for params in param_shapes.values() for _, s in params)
    if elements * 8 > LARGEST_ARENA_BYTES:  # fp32 values and their gradients
        raise ShapeError(f"variant {variant!r}: input shape {input_shape} makes the network's tensors hold "
                         f"{elements:.3g} values, more than one plan can address (2**60 bytes); lower the "
                         f"batch size, the image size or the layer widths")


# ---- phase 2 ------------------------------------------------------------------------------------
def size_slot(shapes: Shape | dict[str, Shape]) -> tuple[Shape, int, tuple]:
    """(slot shape, elements, sorted (variant, shape) pairs): the slot takes the largest size over the
    variants that use it. `shapes` is one shape (persistent tensors) or {variant: shape}."""
    if not isinstance(shapes, dict):
        return tuple(shapes), math.prod(shapes), ()
    return (max(shapes.values(), key=math.prod), max(math.prod(s) for s in shapes.values()),
            tuple(sorted(shapes.items())))


# ---- phase 4 (the schedule) -----------------------------------------------------------------------
class _GraphBuilder:
    """Collects tensors (with per-variant shapes) and ops for the train and eval graphs."""

    def __init__(self, arch, value_shapes, param_shapes, variants_of, act_dtype, training, slots):
        self.arch = arch
        self.value_shapes = value_shapes
        self.variants_of = variants_of          # graph -> [variant names]
        self.act_dtype = act_dtype
        self.training = training
        self.slots = slots
        self.tensors: list[TensorSpec] = []   # sized, not yet placed (offset -1)
        self.slot_sizes: dict[tuple, tuple] = {}   # size_slot per distinct {variant: shape}; most tensors repeat one
        self.params: list[ParamSpec] = []
        self.prims = _primitive_list(arch)
        self.positions_of: dict[int, list[int]] = {}          # arch layer index -> its primitive positions
        for position, (owner, _) in enumerate(self.prims):
            self.positions_of.setdefault(owner, []).append(position)
        self.producer = {prim.output: prim for _, prim in self.prims}
        self.extras_of: dict[str, dict[int, list]] = {}      # graph -> primitive position -> its extras (see below)
        self.param_tensors: dict[int, dict[str, int]] = {}   # primitive position -> suffix -> tensor
        self.stats_tensors: dict[int, list[tuple[str, int]]] = {}  # primitive position -> (suffix, BN statistic)
        self.grad_tensors: dict[int, int] = {}               # param tensor -> grad tensor
        self.io: dict[str, int] = {}
        self.saved_extras: dict[int, list[tuple[str, int]]] = {}  # primitive position -> saved extras (train)
        self.logits_value = arch.output_value
        self.loss_value = arch.layers[-1].output
        self._persistent(param_shapes)
        self.trainable_positions = {position for position, tids in self.param_tensors.items()   # have trainable params
                                    if any(self.tensors[t].region == "params" for t in tids.values())}

    def new_tensor(self, name, region, dtype, shapes, graph=""):
        """`shapes` is one shape (persistent) or {variant: shape}; the tensor is sized at once (phase 2)."""
        if isinstance(shapes, dict):
            key = tuple(shapes.items())
            if key not in self.slot_sizes:
                self.slot_sizes[key] = size_slot(shapes)
            slot, elements, variant_shapes = self.slot_sizes[key]
        else:
            slot, elements, variant_shapes = size_slot(shapes)
        tid = len(self.tensors)
        self.tensors.append(TensorSpec(tid, name, region, dtype, slot, elements * DTYPE_BYTES[dtype], -1, graph,
                                       variant_shapes))
        return tid

    def _persistent(self, param_shapes):
        for position, (_, prim) in enumerate(self.prims):
            for rule, shape in param_shapes[position]:
                name = f"{prim.prefix}.{rule.suffix}" if prim.prefix else rule.suffix
                dtype = "int64" if rule.suffix == "num_batches_tracked" else "float32"
                tid = self.new_tensor(name, rule.region, dtype, shape)
                self.param_tensors.setdefault(position, {})[rule.suffix] = tid
                if rule.region == "bn_stats":
                    self.stats_tensors.setdefault(position, []).append((rule.suffix, tid))
                layout, flatten_from, fan_in, fan_out = rule.torch_layout, (), 0, 0
                if prim.kind == "conv" and rule.suffix == "weight":
                    fan_in, fan_out = math.prod(shape[1:]), shape[0] * shape[1] * shape[2]
                if prim.kind == "fc":
                    fan_in = param_shapes[position][0][1][1]
                    source = self._flatten_source(prim)
                    if rule.suffix == "weight" and source is not None:
                        layout, flatten_from = "fc_hwc", source
                    elif rule.suffix == "weight":
                        layout = prim.param("torch_layout", "")   # "conv1x1": an se projection
                self.params.append(ParamSpec(name, tid, shape, rule.region, rule.init, position, layout,
                                             flatten_from, fan_in, fan_out))
        duplicates = sorted(n for n, count in Counter(p.name for p in self.params).items() if count > 1)
        if duplicates:
            raise ShapeError(f"two layers produce the same parameter names {duplicates[:5]}; wrap one of them in "
                             f"named('...', ...) to give it a distinct scope")
        if self.training:
            for spec in [p for p in self.params if p.region == "params"]:
                self.grad_tensors[spec.tensor] = self.new_tensor("grad." + spec.name, "grads", "float32", spec.shape)
            trainable = [p for p in self.params if p.region == "params"]
            for slot in range(self.slots):
                for spec in trainable:
                    self.new_tensor(f"state{slot}.{spec.name}", "optim", "float32", spec.shape)
        if self.arch.amp:
            for spec in [p for p in self.params if p.region == "params"]:
                self.new_tensor("fp16." + spec.name, "weights16", "float16", spec.shape)
        all_variants = [v for names in self.variants_of.values() for v in names]
        padded = self.arch.input_channels_padded
        self.io["input"] = self.new_tensor("input", "io", self.act_dtype,
                                           {v: self.value_shapes[v][NETWORK_INPUT][:3] + (padded,) for v in all_variants})
        self.io["labels"] = self.new_tensor("labels", "io", "int64", {v: self.value_shapes[v][NETWORK_INPUT][:1] for v in all_variants})
        self.io["logits"] = self.new_tensor("logits", "io", self.act_dtype, {v: self.value_shapes[v][self.logits_value] for v in all_variants})
        for name, dtype in SCALARS:
            self.io[name] = self.new_tensor(name, "scalars", dtype, ())

    def _flatten_source(self, prim) -> Shape | None:
        source = self.producer.get(prim.inputs[0])
        if source is not None and source.kind == "flatten":
            shapes = next(iter(self.value_shapes.values()))
            return shapes[source.inputs[0]][1:]
        return None

    # -- per graph -----------------------------------------------------------------------------------
    def build(self, graph: str) -> ComputationGraph:
        variants = self.variants_of[graph]
        train = graph == "train"
        value_tensor: dict[int, int] = {NETWORK_INPUT: self.io["input"], self.logits_value: self.io["logits"],
                                        self.loss_value: self.io["loss"]}
        saved_values = self._saved_values() if train else set()
        self.extras_of[graph] = self._graph_extras(graph)

        def shapes_of(value):
            return {v: self.value_shapes[v][value] for v in variants}

        for _, prim in self.prims:
            if prim.output not in value_tensor:
                region = "saved" if prim.output in saved_values else "transient"
                value_tensor[prim.output] = self.new_tensor(f"{graph}.v{prim.output}", region, self.act_dtype,
                                                            shapes_of(prim.output), graph)
        self.value_tensor = value_tensor
        ops: list[Op] = []
        for index, layer in enumerate(self.arch.layers):
            if layer.kind == "softmax_ce":
                continue
            ops.append(self._forward_op(len(ops), index, layer, graph, train, shapes_of))
        grads: dict[int, int] = {}
        loss_writes = [("loss", self.io["loss"]), ("correct", self.io["correct"])]
        if train:
            grads[self.logits_value] = self.new_tensor(f"{graph}.d{self.logits_value}", "transient", self.act_dtype,
                                                       shapes_of(self.logits_value), graph)
            loss_writes.append(("dlogits", grads[self.logits_value]))
        ops.append(Op(len(ops), "softmax_ce", "loss", len(self.arch.layers) - 1, "loss",
                      (("logits", self.io["logits"]), ("labels", self.io["labels"])), tuple(loss_writes)))
        boundary = len(ops)
        if train:
            needs_grad = self._needs_grad()
            for index in range(len(self.arch.layers) - 2, -1, -1):
                op = self._backward_op(len(ops), index, self.arch.layers[index], graph, grads, needs_grad, shapes_of)
                if op is not None:
                    ops.append(op)
            ops.append(self._optimizer_op(len(ops)))
        return ComputationGraph(graph, tuple(ops), boundary if train else -1)

    def _saved_values(self) -> set[int]:
        saved = set()
        for _, layer in enumerate(self.arch.layers):
            if layer.kind in FUSED:
                saved |= self._fused_saved_values(layer)
                continue
            rule = REGISTRY[layer.kind]
            if "input" in rule.saves:
                saved |= set(layer.inputs)
            if "output" in rule.saves:
                saved.add(layer.output)
        return saved - {NETWORK_INPUT, self.logits_value, self.loss_value}

    @staticmethod
    def _fused_saved_values(layer: ArchLayer) -> set[int]:
        """Fused layers save their inputs, every convolution's (pre-BN) output, the fc input and a
        final ReLU's output; BN-apply and activations are recomputed in backward."""
        saved = set(layer.inputs)
        for prim in layer.sub:
            if prim.kind in ("conv", "fc"):
                saved.add(prim.output if prim.kind == "conv" else prim.inputs[0])
        if layer.sub[-1].kind == "relu":
            saved.add(layer.sub[-1].output)
        return saved

    def _needs_grad(self) -> set[int]:
        needs = set()
        for position, (_, prim) in enumerate(self.prims):
            if any(v in needs for v in prim.inputs) or position in self.trainable_positions:
                needs.add(prim.output)
        return needs

    def _graph_extras(self, graph) -> dict[int, list]:
        """Primitive position -> its extras as [(extra, {variant: shape})] over the variants of a graph; only
        primitives that have extras are keys. A rule gives every variant the same extras in the same order."""
        variants = self.variants_of[graph]
        variant_shapes = [self.value_shapes[v] for v in variants]
        extras_of = {}
        for position, (_, prim) in enumerate(self.prims):
            if prim.kind not in KINDS_WITH_EXTRAS:
                continue
            extras = REGISTRY[prim.kind].extras
            per_variant = [extras(prim, [shapes[i] for i in prim.inputs], shapes[prim.output]) for shapes in variant_shapes]
            if per_variant[0]:
                extras_of[position] = [(extra, {v: found[k][1] for v, found in zip(variants, per_variant)})
                                       for k, (extra, _) in enumerate(per_variant[0])]
        return extras_of

    def _extras(self, prim, position, graph, shapes_of, phase):
        extras = self.extras_of[graph].get(position)
        if not extras:
            return []
        out = []
        eval_workspaces = graph == "eval" and not REGISTRY[prim.kind].train_only_extras
        for extra, variant_shapes in extras:
            saved, phases = extra.saved, extra.phases
            if saved and graph == "eval":   # nothing reads it back; the forward kernel may still need room for it
                if not eval_workspaces:
                    continue
                saved, phases = False, "f"
            if saved and phase == "b":
                continue
            if not saved and phase not in phases:
                continue
            dtype = self.act_dtype if extra.dtype == "act" else extra.dtype
            region = "saved" if saved else "transient"
            suffix = extra.role if saved else f"{extra.role}_{phase}"
            tid = self.new_tensor(f"{graph}.{prim.prefix or prim.path}:{suffix}", region, dtype, variant_shapes, graph)
            if saved:
                self.saved_extras.setdefault(position, []).append((extra.role, tid))
            out.append((extra.role, tid))
        return out

    def _forward_op(self, op_index, index, layer, graph, train, shapes_of) -> Op:
        reads, writes, produced = [], [], set()
        fused = layer.kind in FUSED
        value_tensor = self.value_tensor
        graph_extras = self.extras_of[graph]
        for position in self.positions_of[index]:
            prim = self.prims[position][1]
            tag = f"{position}:" if fused else ""
            names = ("a", "b") if prim.kind == "add" else ("x", "s") if prim.kind == "channel_mul" else ("x",)
            for role, value in zip(names, prim.inputs):
                if value not in produced:
                    reads.append((tag + role, value_tensor[value]))
            params = self.param_tensors.get(position)
            if params:
                reads += [(tag + suffix, tid) for suffix, tid in params.items()]
                if train and position in self.stats_tensors:   # training updates the running statistics
                    writes += [(tag + suffix, tid) for suffix, tid in self.stats_tensors[position]]
            writes.append((tag + "y", value_tensor[prim.output]))
            produced.add(prim.output)
            if position in graph_extras:
                writes += [(tag + role, tid) for role, tid in self._extras(prim, position, graph, shapes_of, "f")]
        attrs = (("training", train),)
        return Op(op_index, layer.kind, "forward", index, layer.name, tuple(reads), tuple(writes), attrs)

    def _grad(self, grads, value, graph, shapes_of):
        if value not in grads:
            grads[value] = self.new_tensor(f"{graph}.d{value}", "transient", self.act_dtype, shapes_of(value), graph)
        return grads[value]

    def _backward_op(self, op_index, index, layer, graph, grads, needs_grad, shapes_of) -> Op | None:
        positions = self.positions_of[index]
        has_params = not self.trainable_positions.isdisjoint(positions)
        external = [v for v in layer.inputs if v in needs_grad]
        if not has_params and not external:
            return None
        if layer.output not in grads:
            return None  # its output feeds nothing that has a gradient
        fused = layer.kind in FUSED
        reads = [("dy", grads[layer.output])]
        writes, attrs = [], []
        saved_values = self._fused_saved_values(layer) if fused else None
        for position in () if fused else positions:
            prim = self.prims[position][1]
            saves = REGISTRY[prim.kind].saves
            if "input" in saves:
                reads.append(("x", self.value_tensor[prim.inputs[0]]))
            if "output" in saves:
                reads.append(("y", self.value_tensor[prim.output]))
            if prim.kind == "channel_mul":
                reads.append(("s", self.value_tensor[prim.inputs[1]]))
            params = self.param_tensors.get(position)
            if params and "weight" in params:
                reads.append(("weight", params["weight"]))
            reads += self._saved_extra_tensors(position)
            if position in self.extras_of[graph]:
                writes += self._extras(prim, position, graph, shapes_of, "b")
        if fused:
            reads += self._fused_backward_reads(positions, saved_values)
            writes += self._fused_workspace(positions, saved_values, graph, shapes_of)
        for position in positions:
            params = self.param_tensors.get(position)
            if not params:
                continue
            tag = f"{position}:" if fused else ""
            for suffix, tid in params.items():
                if tid in self.grad_tensors:
                    writes.append((tag + "d" + suffix, self.grad_tensors[tid]))
        if layer.kind == "add":
            roles = ("da", "db")
        elif layer.kind == "channel_mul":
            roles = ("dx", "ds")
        else:
            roles = tuple(f"dx{i}" for i in range(len(layer.inputs))) if fused else ("dx",) * len(layer.inputs)
        created_here: set[int] = set()
        for role, value in zip(roles, layer.inputs):
            if value not in needs_grad:
                continue
            accumulate = value in grads
            tid = self._grad(grads, value, graph, shapes_of)
            if not accumulate:
                created_here.add(tid)
            # add(x, x): the second role adds onto what the first role of this same op wrote, so it
            # reads nothing that an earlier op wrote
            if accumulate and tid not in created_here:
                reads.append((role, tid))
            writes.append((role, tid))
            attrs.append(("accumulate_" + role, accumulate))
        return Op(op_index, layer.kind, "backward", index, layer.name, tuple(reads), tuple(writes), tuple(attrs))

    def _saved_extra_tensors(self, position):
        return self.saved_extras.get(position, [])

    def _fused_backward_reads(self, positions, saved_values):
        reads = []
        for position in positions:
            _, prim = self.prims[position]
            for value in (prim.output, *prim.inputs):
                if value in saved_values:
                    reads.append((f"saved{value}", self.value_tensor[value]))
            for suffix, tid in self.param_tensors.get(position, {}).items():
                if self.tensors[tid].region == "params":
                    reads.append((f"{position}:{suffix}", tid))
            reads += [(f"{position}:{role}", tid) for role, tid in self._saved_extra_tensors(position)]
        return list(dict.fromkeys(reads))

    def _fused_workspace(self, positions, saved_values, graph, shapes_of):
        """Recomputed internal values and internal gradients live only inside the fused backward op."""
        writes = []
        internal = [self.prims[p][1] for p in positions]
        last = internal[-1].output
        for prim in internal:
            if prim.output != last and prim.output not in saved_values:
                writes.append((f"recompute{prim.output}", self.new_tensor(f"{graph}.r{prim.output}", "transient",
                                                                           self.act_dtype, shapes_of(prim.output), graph)))
            if prim.output != last:
                writes.append((f"grad{prim.output}", self.new_tensor(f"{graph}.g{prim.output}", "transient",
                                                                      self.act_dtype, shapes_of(prim.output), graph)))
        for position in positions:
            _, prim = self.prims[position]
            writes += [(f"{position}:{role}", tid) for role, tid in self._extras(prim, position, graph, shapes_of, "b")]
        return writes

    def _optimizer_op(self, op_index) -> Op:
        state = [("state", t.id) for t in self.tensors if t.region == "optim"]
        reads = [("grad", g) for g in self.grad_tensors.values()] + [("param", p) for p in self.grad_tensors]
        reads += state
        reads += [("lr", self.io["lr"]), ("step", self.io["step"])]
        writes = [("param", p) for p in self.grad_tensors] + state
        writes.append(("step", self.io["step"]))
        return Op(op_index, "optimizer", "optimizer", -1, "optimizer", tuple(reads), tuple(writes))


class Compiler:
    """Compile an ArchPlan for a set of input shapes (variants).

    >>> from blueprint import zoo
    >>> from planner import ArchPlan
    >>> arch = ArchPlan.from_blueprint(zoo.resnet20())
    >>> plan = Compiler(arch).compile(variants={"train": (8, 32, 32, 3), "eval": (4, 32, 32, 3)})
    >>> plan.params_trainable
    272474
    """

    def __init__(self, arch: ArchPlan):
        if not isinstance(arch, ArchPlan):
            raise TypeError(f"Compiler(arch): expected an ArchPlan, got {type(arch).__name__}")
        self.arch = arch

    def compile(self, variants: dict[str, Shape], training: bool = True, optimizer_state_slots: int = 1) -> CompiledPlan:
        start = time.perf_counter()
        with _cyclic_gc_paused():
            plan = self._compile(variants, training, optimizer_state_slots)
        return replace(plan, compile_ms=(time.perf_counter() - start) * 1e3)

    def _compile(self, variants, training, optimizer_state_slots) -> CompiledPlan:
        from planner.memory import plan_memory

        if not variants:
            raise ValueError("Compiler.compile(variants): give at least one variant, e.g. {'train': (32, 32, 32, 3)}")
        if optimizer_state_slots not in (0, 1, 2):
            raise ValueError(f"Compiler.compile(optimizer_state_slots): expected 0, 1 or 2, got {optimizer_state_slots}")
        arch = self.arch
        variants = {name: tuple(shape) for name, shape in variants.items()}
        variants_of: dict[str, list[str]] = {}
        for name in variants:
            graph = "train" if training and name.startswith("train") else "eval"
            variants_of.setdefault(graph, []).append(name)
        value_shapes, param_shapes = infer_shapes(arch, variants)                        # 1
        act_dtype = "float16" if arch.amp else "float32"
        builder = _GraphBuilder(arch, value_shapes, param_shapes, variants_of, act_dtype, training,
                                optimizer_state_slots if training else 0)
        graphs = {graph: builder.build(graph) for graph in sorted(variants_of, reverse=True)}   # 4 (and 2)
        tensors, memory = plan_memory(builder.tensors, graphs)                           # 3
        variant_plans = share_variants(variants, variants_of, tensors)                   # 5
        macs = {}
        for position, (_, prim) in enumerate(builder.prims):
            shapes = value_shapes[next(iter(variants))]
            ins = [shapes[v] for v in prim.inputs]
            out = shapes[prim.output]
            macs[position] = REGISTRY[prim.kind].macs(prim, [(1,) + s[1:] for s in ins], (1,) + out[1:] if out else out)
        return CompiledPlan(arch, tuple(p for _, p in builder.prims), variant_plans, value_shapes, graphs,
                            tuple(tensors), tuple(builder.params), memory, dict(builder.io), macs, act_dtype,
                            training, optimizer_state_slots if training else 0)


@contextlib.contextmanager
def _cyclic_gc_paused():
    """A compile allocates tens of thousands of small objects (tuples, named tuples, records) that
    reference counting frees or the plan keeps; left on, the cyclic collector walks them again and
    again (about a tenth of a ResNet-152 compile). Paused for the compile only and turned back on
    only if it was on; a cycle made meanwhile is collected by the next pass after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# ---- phase 5 ------------------------------------------------------------------------------------
def share_variants(variants, variants_of, tensors) -> dict[str, VariantPlan]:
    """Every shape in a graph follows from the input shape, so (graph, input shape) is the signature."""
    return {name: VariantPlan(name, graph, variants[name], (graph, variants[name]))
            for graph, names in variants_of.items() for name in names}
