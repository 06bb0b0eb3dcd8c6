"""Phase 4 of the compiler: the tensors and op schedules of the train and eval graphs.

A straight line of small phases, each a function of explicit inputs returning a frozen value
that the next one takes:

    persistent_tensors   parameters (with their gradients, optimizer state, fp16 copies), BN
                         statistics, I/O and scalars: laid out once, shared by every graph
    saved_values         which values a train graph keeps from forward for backward
    graph_extras         each primitive's extras (statistics, masks, workspaces) per variant, and under
                         AMP the padded-input workspace of a convolution with Cin % 8 != 0
    value_tensors        one tensor per value of a graph
    forward_ops          the forward schedule (and the extras it writes)
    loss_op              softmax cross-entropy, and the logits' gradient in training
    backward_ops         the backward schedule in reverse layer order, with input gradients,
                         recompute workspaces and internal gradients of fused ops
    optimizer_op         one update over every trainable parameter

Tensor ids are consecutive in the order the phases make them (each phase starts where the
previous one stopped), so a plan's tensor list reads persistent first, then each graph.
"""
from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, replace

from planner._arch import FUSED, NETWORK_INPUT, ArchLayer, ArchPlan
from planner.plan import (
    DTYPE_BYTES, INPUT_ROLES, PARAM_GRADIENT, ComputationGraph, Op, Operand, ParamSpec, Region, Role, Shape,
    TensorSpec, gradient_roles, new_record, role_named,
)
from planner.conv_algorithm import conv_algorithms
from planner.expand import align_input_channels
from planner.ops import COL, KINDS_WITH_EXTRAS, OPS, X_PADDED, Extra, ShapeError

SCALARS = (("loss", "float32"), ("lr", "float32"), ("step", "int64"), ("loss_scale", "float32"),
           ("overflow", "int32"), ("good_steps", "int32"), ("correct", "int32"),
           ("iteration", "int32"))   # iteration: every train step, skipped ones too (dropout draws)


def primitive_list(arch: ArchPlan) -> list[tuple[int, ArchLayer]]:
    """(arch layer index, primitive) for every primitive, in plan order (a primitive's position)."""
    return [(index, prim) for index, layer in enumerate(arch.layers) for prim in (layer.sub or (layer,))]


def size_slot(shapes: Shape | dict[str, Shape]) -> tuple[Shape, int, tuple]:
    """(slot shape, elements, sorted (variant, shape) pairs): the slot takes the largest size over the
    variants that use it (phase 2). `shapes` is one shape (persistent tensors) or {variant: shape}."""
    if not isinstance(shapes, dict):
        return tuple(shapes), math.prod(shapes), ()
    return (max(shapes.values(), key=math.prod), max(math.prod(s) for s in shapes.values()),
            tuple(sorted(shapes.items())))


@functools.lru_cache(maxsize=4096)
def _variant_slot(variant_shapes: tuple) -> tuple[Shape, int, tuple]:
    """`size_slot` of ((variant, shape), ...): most graph tensors repeat a few of them."""
    return size_slot(dict(variant_shapes))


class _TensorMaker:
    """The tensors one phase makes, sized at once, with consecutive ids from `first`."""

    def __init__(self, first: int):
        self.first = first
        self.made: list[TensorSpec] = []

    def new(self, name: str, region: Region, dtype: str, shapes, graph: str = "") -> int:
        """`shapes` is one shape (persistent) or {variant: shape}."""
        sized = _variant_slot(tuple(shapes.items())) if isinstance(shapes, dict) else size_slot(shapes)
        return self.sized(name, region, dtype, sized, graph)

    def sized(self, name: str, region: Region, dtype: str, sized: tuple, graph: str = "") -> int:
        """`sized` is `size_slot`'s (slot shape, elements, variant shapes), e.g. `Setting.value_slots[graph][value]`."""
        slot, elements, variant_shapes = sized
        tid = self.first + len(self.made)
        self.made.append(new_record(TensorSpec, (tid, name, region, dtype, slot, elements * DTYPE_BYTES[dtype], -1,
                                                 graph, variant_shapes)))
        return tid


@dataclass(frozen=True, slots=True)
class Setting:
    """What every phase reads: the plan being compiled and the compile's choices."""
    arch: ArchPlan
    prims: tuple[tuple[int, ArchLayer], ...]      # primitive_list(arch)
    positions_of: dict[int, tuple[int, ...]]      # arch layer index -> its primitive positions
    names: tuple[str, ...]                        # arch layer index -> its name (a property worth computing once)
    value_shapes: dict[str, dict[int, Shape]]     # variant -> value -> shape
    variants_of: dict[str, list[str]]             # graph -> its variants
    value_slots: dict[str, dict[int, tuple]]      # graph -> value -> size_slot of its shapes in the graph's variants
    act_dtype: str
    training: bool
    slots: int                                     # optimizer state slots

    @property
    def logits_value(self) -> int:
        return self.arch.output_value

    @property
    def loss_value(self) -> int:
        return self.arch.layers[-1].output


def setting_for(arch, value_shapes, variants_of, act_dtype, training, slots) -> Setting:
    prims = tuple(primitive_list(arch))
    positions_of: dict[int, list[int]] = {}
    for position, (owner, _) in enumerate(prims):
        positions_of.setdefault(owner, []).append(position)
    # sized once per value, not per tensor: a value's own tensor, its gradient and a fused op's workspaces share it
    value_slots = {graph: {value: _variant_slot(tuple((v, value_shapes[v][value]) for v in names))
                           for value in value_shapes[names[0]]} for graph, names in variants_of.items()}
    return Setting(arch, prims, {k: tuple(v) for k, v in positions_of.items()},
                   tuple(layer.name for layer in arch.layers), value_shapes, variants_of, value_slots, act_dtype,
                   training, slots)


# ---- persistent tensors ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Persistent:
    tensors: tuple[TensorSpec, ...]
    params: tuple[ParamSpec, ...]                 # with their grad / half / state tensor ids
    params_at: dict[int, tuple[ParamSpec, ...]]   # primitive position -> its parameters and statistics
    trainable: frozenset[int]                     # positions that have trainable parameters
    io: dict[str, int]                            # "input", "labels", "logits", scalars -> tensor id
    # made once and shared by the ops of every graph: position -> params_at as operands (with the
    # position in a fused op), and the BN statistics among them (a training forward writes them)
    param_operands: dict[int, tuple[Operand, ...]]
    stat_operands: dict[int, tuple[Operand, ...]]
    # position of a convolution -> its op attr ("conv", ConvAlgorithms): the CPU algorithm of each direction
    conv_attrs: dict[int, tuple[tuple[str, object], ...]]


def padded_conv_positions(s: Setting) -> dict[int, int]:
    """Under AMP, each groups-1 convolution whose input channels are not a multiple of 8 -> those channels rounded
    up to one: the CUDA path runs it on the aligned tensor-core kernels (issue 23) with an fp16 weight copy of as
    many channels, the extra columns zero (``ParamSpec.half_padded``), on its input zero-padded to match: the
    network input's slot itself for the stems (``padded_stem_positions``), else a workspace the op pads the input
    into (``Role.X_PADDED``, forward and backward). The master weight, its gradient and optimizer state keep the
    real channels."""
    if not s.arch.amp:
        return {}
    shapes = next(iter(s.value_shapes.values()))
    padded = {}
    for position, (_, prim) in enumerate(s.prims):
        if prim.kind == "conv" and prim.param("groups") == 1:
            channels = shapes[prim.inputs[0]][-1]
            if align_input_channels(channels, True) != channels:
                padded[position] = align_input_channels(channels, True)
    return padded


def padded_stem_positions(s: Setting) -> frozenset[int]:
    """The padded convolutions (``padded_conv_positions``) that read the network input's slot padded itself: when
    every reader of the network input is a groups-1 convolution (the stem), the slot has the padded channels (the
    batch is uploaded with its real ones into ``input_unpadded`` and padded by the step's first kernel)."""
    readers = [(position, prim) for position, (_, prim) in enumerate(s.prims) if NETWORK_INPUT in prim.inputs]
    if (not s.arch.amp or s.arch.input_channels_padded == s.arch.in_channels or not readers
            or any(prim.kind != "conv" or prim.param("groups") != 1 for _, prim in readers)):
        return frozenset()
    return frozenset(position for position, _ in readers)


def padded_input_workspaces(s: Setting) -> dict[int, int]:
    """The padded convolutions that pad their input into a workspace of their own (not a stem on the padded
    network input) -> its channels."""
    stems = padded_stem_positions(s)
    return {position: channels for position, channels in padded_conv_positions(s).items() if position not in stems}


SE_PROJECTION = "conv1x1"   # an se's fc weight (out, in) is a 1x1 convolution's (out, in, 1, 1) in PyTorch


def persistent_tensors(s: Setting, param_shapes) -> Persistent:
    make = _TensorMaker(0)
    producer = {prim.output: prim for _, prim in s.prims}
    rows = []   # ParamSpec fields up to `role`; the linked tensors are made after every parameter
    conv_attrs = {}
    for position, (_, prim) in enumerate(s.prims):
        for rule, shape in param_shapes[position]:
            role, region = _role_and_region(prim.kind, rule.suffix, rule.region)
            name = f"{prim.prefix}.{rule.suffix}" if prim.prefix else rule.suffix
            dtype = "int64" if role is Role.NUM_BATCHES_TRACKED else "float32"
            tid = make.new(name, region, dtype, shape)
            layout, flatten_from, fan_in, fan_out = rule.torch_layout, (), 0, 0
            if prim.kind == "conv" and role is Role.WEIGHT:
                fan_in, fan_out = math.prod(shape[1:]), shape[0] * shape[1] * shape[2]
                image = max((shapes[prim.inputs[0]][:3] for shapes in s.value_shapes.values()), key=math.prod)
                conv_attrs[position] = (("conv", conv_algorithms(shape, prim.param("stride"), prim.param("padding"),
                                                                 prim.param("groups"), image)),)
            if prim.kind == "fc":
                fan_in = param_shapes[position][0][1][1]
                source = _flatten_source(s, producer, prim)
                if role is Role.WEIGHT and source is not None:
                    layout, flatten_from = "fc_hwc", source
                elif role is Role.WEIGHT:
                    layout = SE_PROJECTION if prim.group_kind == "se" else ""
            rows.append((name, tid, shape, region, rule.init, position, layout, flatten_from, fan_in, fan_out, role))
    duplicates = sorted(n for n, count in Counter(row[0] for row in rows).items() if count > 1)
    if duplicates:
        raise ShapeError(f"two layers produce the same parameter names {duplicates[:5]}; wrap one of them in "
                         f"named('...', ...) to give it a distinct scope")
    trainable = [row for row in rows if row[3] == Region.PARAMS]
    grad, state, half = {}, {row[1]: [] for row in trainable}, {}
    param_size = {tid: size_slot(shape) for _, tid, shape, *_ in trainable}   # a linked tensor has its parameter's size
    if s.training:
        for name, tid, *_ in trainable:
            grad[tid] = make.sized("grad." + name, Region.GRADS, "float32", param_size[tid])
        for slot in range(s.slots):
            for name, tid, *_ in trainable:
                state[tid].append(make.sized(f"state{slot}.{name}", Region.OPTIM, "float32", param_size[tid]))
    half_padded = {}
    if s.arch.amp:
        for name, tid, *_ in trainable:
            half[tid] = make.sized("fp16." + name, Region.WEIGHTS16, "float16", param_size[tid])
        padded = padded_conv_positions(s)
        for name, tid, shape, _, _, position, *_, role in trainable:
            if position in padded and role is Role.WEIGHT:
                half_padded[tid] = make.new("fp16pad." + name, Region.WEIGHTS16, "float16",
                                            shape[:3] + (padded[position],))
    io = _io_tensors(s, make, bool(padded_stem_positions(s)))
    params = tuple(new_record(ParamSpec, (*row, grad.get(row[1], -1), half.get(row[1], -1),
                                          tuple(state.get(row[1], ())), half_padded.get(row[1], -1))) for row in rows)
    params_at: dict[int, list[ParamSpec]] = {}
    for spec in params:
        params_at.setdefault(spec.layer, []).append(spec)
    param_operands, stat_operands = {}, {}
    for position, specs in params_at.items():
        at = position if s.arch.layers[s.prims[position][0]].kind in FUSED else -1
        param_operands[position] = tuple(new_record(Operand, (spec.role, spec.tensor, at, -1, False)) for spec in specs)
        stats = tuple(o for o, spec in zip(param_operands[position], specs) if spec.region == Region.BN_STATS)
        if stats:
            stat_operands[position] = stats
    return Persistent(tuple(make.made), params, {k: tuple(v) for k, v in params_at.items()},
                      frozenset(row[5] for row in trainable), io, param_operands, stat_operands, conv_attrs)


@functools.lru_cache(maxsize=None)
def _role_and_region(kind: str, suffix: str, region: str) -> tuple[Role, Region]:
    """A parameter rule's role and region, made once per rule, not per parameter (enum lookups are slow)."""
    return role_named(suffix, f"{kind} parameter"), Region(region)


@functools.lru_cache(maxsize=None)
def _extra_role(kind: str, extra: str) -> Role:
    return role_named(extra, f"{kind} extra")


def _io_tensors(s: Setting, make: _TensorMaker, padded_stems: bool) -> dict[str, int]:
    """The batch, labels and logits slots (and the scalars). ``padded_stems``: the input slot's padded channels
    feed a stem's aligned GEMMs; the batch is then uploaded with its real channels into ``input_unpadded``, and a
    kernel of the step writes it into ``input`` with zeros in the padded channels (the CUDA path)."""
    variants = [v for names in s.variants_of.values() for v in names]
    padded = s.arch.input_channels_padded
    io = {"input": make.new("input", Region.IO, s.act_dtype,
                            {v: s.value_shapes[v][NETWORK_INPUT][:3] + (padded,) for v in variants}),
          "labels": make.new("labels", Region.IO, "int64", {v: s.value_shapes[v][NETWORK_INPUT][:1] for v in variants}),
          "logits": make.new("logits", Region.IO, s.act_dtype,
                             {v: s.value_shapes[v][s.logits_value] for v in variants})}
    if padded_stems:
        io["input_unpadded"] = make.new("input_unpadded", Region.IO, s.act_dtype,
                                        {v: s.value_shapes[v][NETWORK_INPUT] for v in variants})
    for name, dtype in SCALARS:
        io[name] = make.new(name, Region.SCALARS, dtype, ())
    return io


def _flatten_source(s: Setting, producer, prim) -> Shape | None:
    source = producer.get(prim.inputs[0])
    if source is not None and source.kind == "flatten":
        shapes = next(iter(s.value_shapes.values()))
        return shapes[source.inputs[0]][1:]
    return None


# ---- what a train graph keeps, and each primitive's extras ---------------------------------------
def saved_values(s: Setting) -> frozenset[int]:
    saved = set()
    for layer in s.arch.layers:
        if layer.kind in FUSED:
            saved |= fused_saved_values(layer)
            continue
        rule = OPS[layer.kind]
        if "input" in rule.saves:
            saved |= set(layer.inputs)
        if "output" in rule.saves:
            saved.add(layer.output)
    return frozenset(saved - {NETWORK_INPUT, s.logits_value, s.loss_value})


def fused_saved_values(layer: ArchLayer) -> set[int]:
    """Fused layers save their inputs, every convolution's (pre-BN) output, the fc input and a
    final ReLU's output; BN-apply and activations are recomputed in backward."""
    saved = set(layer.inputs)
    for prim in layer.sub:
        if prim.kind in ("conv", "fc"):
            saved.add(prim.output if prim.kind == "conv" else prim.inputs[0])
    if layer.sub[-1].kind == "relu":
        saved.add(layer.sub[-1].output)
    return saved


def graph_extras(s: Setting, p: Persistent, graph: str) -> dict[int, tuple]:
    """Primitive position -> its extras as ((extra, {variant: shape}), ...) over the variants of a graph;
    only primitives that have extras are keys. A rule gives every variant the same extras in the same order."""
    variants = s.variants_of[graph]
    variant_shapes = [s.value_shapes[v] for v in variants]
    extras_of = {}
    for position, (_, prim) in enumerate(s.prims):
        if prim.kind not in KINDS_WITH_EXTRAS:
            continue
        extras = OPS[prim.kind].extras
        per_variant = [extras(prim, [shapes[i] for i in prim.inputs], shapes[prim.output]) for shapes in variant_shapes]
        if prim.kind == "conv" and per_variant[0]:
            col = _col_workspace(s, prim, dict(p.conv_attrs[position])["conv"])
            per_variant = [[(col, shape) for extra, shape in found if extra is COL and col is not None]
                           for found in per_variant]
        if per_variant[0]:
            extras_of[position] = tuple((extra, {v: found[k][1] for v, found in zip(variants, per_variant)})
                                        for k, (extra, _) in enumerate(per_variant[0]))
    for position, channels in padded_input_workspaces(s).items():   # AMP: the input zero-padded to 8k channels
        x = s.prims[position][1].inputs[0]
        extras_of[position] = extras_of.get(position, ()) + (
            (X_PADDED, {v: shapes[x][:3] + (channels,) for v, shapes in zip(variants, variant_shapes)}),)
    return extras_of


def _col_workspace(s: Setting, prim, algorithms) -> Extra | None:
    """A convolution's im2col workspace (``COL``), in the phases whose CPU algorithm (the plan's ``conv`` attr,
    `planner.conv_algorithm`) is im2col + GEMM: the forward's; the backward's when its weight gradient is one, or
    its input gradient and the input needs one (not the network input); or None. The CUDA path (AMP plans) reads
    no workspace of the kind."""
    if s.arch.amp:
        return None
    backward = (algorithms.input_grad if prim.inputs[0] != NETWORK_INPUT else "direct", algorithms.weight_grad)
    phases = ("f" if algorithms.forward == "gemm" else "") + ("b" if "gemm" in backward else "")
    return replace(COL, phases=phases) if phases else None


def _extra_tensors(s: Setting, make: _TensorMaker, prim, extras, graph: str,
                   phase: str) -> list[tuple[Role, int, bool]]:
    """(role, tensor, saved) of the extras a primitive's `phase` ("f" forward, "b" backward) writes."""
    out = []
    eval_workspaces = graph == "eval" and not OPS[prim.kind].train_only_extras
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
        dtype = s.act_dtype if extra.dtype == "act" else extra.dtype
        suffix = extra.role if saved else f"{extra.role}_{phase}"
        tid = make.new(f"{graph}.{prim.prefix or prim.path}:{suffix}", Region.SAVED if saved else Region.TRANSIENT,
                       dtype, variant_shapes, graph)
        out.append((_extra_role(prim.kind, extra.role), tid, saved))
    return out


# ---- one graph's values and forward ops -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Values:
    tensors: tuple[TensorSpec, ...]
    tensor_of: dict[int, int]                     # value -> tensor


def value_tensors(s: Setting, p: Persistent, graph: str, saved: frozenset[int], first: int) -> Values:
    make, slots = _TensorMaker(first), s.value_slots[graph]
    tensor_of = {NETWORK_INPUT: p.io["input"], s.logits_value: p.io["logits"], s.loss_value: p.io["loss"]}
    for _, prim in s.prims:
        if prim.output not in tensor_of:
            region = Region.SAVED if prim.output in saved else Region.TRANSIENT
            tensor_of[prim.output] = make.sized(f"{graph}.v{prim.output}", region, s.act_dtype, slots[prim.output],
                                                graph)
    return Values(tuple(make.made), tensor_of)


@dataclass(frozen=True, slots=True)
class Forward:
    ops: tuple[Op, ...]
    tensors: tuple[TensorSpec, ...]
    saved_extras: dict[int, tuple[tuple[Role, int], ...]]   # position -> extras saved for backward


def forward_ops(s: Setting, p: Persistent, values: Values, extras_of, graph: str, first: int) -> Forward:
    make, ops, saved_extras = _TensorMaker(first), [], {}
    train = graph == "train"
    tensor_of, attrs = values.tensor_of, (("training", train),)
    y = Role.Y   # enum members read once, not per operand
    for index, layer in enumerate(s.arch.layers):
        if layer.kind == "softmax_ce":
            continue
        reads, writes, produced = [], [], set()
        fused = layer.kind in FUSED
        for position in s.positions_of[index]:
            prim = s.prims[position][1]
            at = position if fused else -1
            for role, value in zip(INPUT_ROLES[prim.kind], prim.inputs):
                if value not in produced:
                    reads.append(new_record(Operand, (role, tensor_of[value], at, -1, False)))
            reads += p.param_operands.get(position, ())
            if train:   # training updates the running statistics
                writes += p.stat_operands.get(position, ())
            writes.append(new_record(Operand, (y, tensor_of[prim.output], at, -1, False)))
            produced.add(prim.output)
            if position in extras_of:
                made = _extra_tensors(s, make, prim, extras_of[position], graph, "f")
                writes += [new_record(Operand, (role, tid, at, -1, False)) for role, tid, _ in made]
                if any(saved for _, _, saved in made):
                    saved_extras[position] = tuple((role, tid) for role, tid, saved in made if saved)
        op_attrs = attrs + p.conv_attrs[position] if layer.kind == "conv" else attrs
        ops.append(new_record(Op, (len(ops), layer.kind, "forward", index, s.names[index], tuple(reads),
                                   tuple(writes), op_attrs)))
    return Forward(tuple(ops), tuple(make.made), saved_extras)


@dataclass(frozen=True, slots=True)
class Loss:
    op: Op
    tensors: tuple[TensorSpec, ...]
    grads: dict[int, int]                         # value -> gradient tensor: the logits' in training


def loss_op(s: Setting, p: Persistent, graph: str, index: int, first: int) -> Loss:
    make, grads = _TensorMaker(first), {}
    writes = [Operand(Role.LOSS, p.io["loss"]), Operand(Role.CORRECT, p.io["correct"])]
    if graph == "train":
        grads[s.logits_value] = make.sized(f"{graph}.d{s.logits_value}", Region.TRANSIENT, s.act_dtype,
                                           s.value_slots[graph][s.logits_value], graph)
        writes.append(Operand(Role.DLOGITS, grads[s.logits_value]))
    op = Op(index, "softmax_ce", "loss", len(s.arch.layers) - 1, "loss",
            (Operand(Role.LOGITS, p.io["logits"]), Operand(Role.LABELS, p.io["labels"])), tuple(writes))
    return Loss(op, tuple(make.made), grads)


# ---- backward and optimizer -----------------------------------------------------------------------
def needs_grad(s: Setting, p: Persistent) -> frozenset[int]:
    """Values whose gradient backward computes: outputs of trainable primitives and everything after."""
    needs = set()
    for position, (_, prim) in enumerate(s.prims):
        if any(v in needs for v in prim.inputs) or position in p.trainable:
            needs.add(prim.output)
    return frozenset(needs)


@dataclass(frozen=True, slots=True)
class Backward:
    ops: tuple[Op, ...]
    tensors: tuple[TensorSpec, ...]


def backward_ops(s: Setting, p: Persistent, values: Values, forward: Forward, extras_of, loss: Loss, graph: str,
                 first_index: int, first: int) -> Backward:
    """Layers in reverse order; a layer without trainable parameters or input gradients to compute, or
    whose output feeds nothing with a gradient, gets no op."""
    make, ops = _TensorMaker(first), []
    needs = needs_grad(s, p)
    grads = dict(loss.grads)      # value -> its gradient tensor, as backward reaches it
    dy = Role.DY
    for index in range(len(s.arch.layers) - 2, -1, -1):
        layer = s.arch.layers[index]
        positions = s.positions_of[index]
        if p.trainable.isdisjoint(positions) and not any(v in needs for v in layer.inputs):
            continue
        if layer.output not in grads:
            continue
        reads, writes = [new_record(Operand, (dy, grads[layer.output], -1, -1, False))], []
        if layer.kind in FUSED:
            kept = fused_saved_values(layer)
            reads += _fused_backward_reads(s, p, values, forward, positions, kept)
            writes += _fused_workspace(s, make, extras_of, positions, kept, graph)
        else:
            _unfused_backward_operands(s, p, values, forward, extras_of, make, graph, positions[0], reads, writes)
        for position in positions:
            if position in p.trainable:
                at = position if layer.kind in FUSED else -1
                writes += [new_record(Operand, (PARAM_GRADIENT[spec.role], spec.grad, at, -1, False))
                           for spec in p.params_at[position] if spec.grad >= 0]
        _input_gradients(s, make, layer, needs, grads, graph, reads, writes)
        op_attrs = p.conv_attrs[positions[0]] if layer.kind == "conv" else ()
        ops.append(new_record(Op, (first_index + len(ops), layer.kind, "backward", index, s.names[index], tuple(reads),
                                   tuple(writes), op_attrs)))
    return Backward(tuple(ops), tuple(make.made))


def _unfused_backward_operands(s, p, values, forward, extras_of, make, graph, position, reads, writes) -> None:
    prim = s.prims[position][1]
    saves = OPS[prim.kind].saves
    tensor_of, weight = values.tensor_of, Role.WEIGHT
    if "input" in saves:   # every input, by its row's role (channel_mul's backward reads x and s)
        reads += [new_record(Operand, (role, tensor_of[v], -1, -1, False))
                  for role, v in zip(INPUT_ROLES[prim.kind], prim.inputs)]
    if "output" in saves:
        reads.append(new_record(Operand, (Role.Y, tensor_of[prim.output], -1, -1, False)))
    if position in p.param_operands:
        reads += [operand for operand in p.param_operands[position] if operand.role is weight]
    if position in forward.saved_extras:
        reads += [new_record(Operand, (role, tid, -1, -1, False)) for role, tid in forward.saved_extras[position]]
    if position in extras_of:
        made = _extra_tensors(s, make, prim, extras_of[position], graph, "b")
        writes += [new_record(Operand, (role, tid, -1, -1, False)) for role, tid, _ in made]


def _input_gradients(s, make, layer, needs, grads, graph, reads, writes) -> None:
    """The gradient of each input that needs one: a new tensor, or (a value used twice) added onto the
    one an earlier op wrote. Fused ops name each by the input `value`."""
    roles = gradient_roles(layer)
    fused = layer.kind in FUSED
    created_here: set[int] = set()
    for role, value in zip(roles, layer.inputs):
        if value not in needs:
            continue
        accumulate = value in grads
        if not accumulate:
            grads[value] = make.sized(f"{graph}.d{value}", Region.TRANSIENT, s.act_dtype, s.value_slots[graph][value],
                                      graph)
            created_here.add(grads[value])
        tid, key = grads[value], value if fused else -1
        # add(x, x): the second role adds onto what the first role of this same op wrote, so it
        # reads nothing that an earlier op wrote
        if accumulate and tid not in created_here:
            reads.append(new_record(Operand, (role, tid, -1, key, False)))
        writes.append(new_record(Operand, (role, tid, -1, key, accumulate)))


def _fused_backward_reads(s, p, values, forward, positions, kept) -> list[Operand]:
    reads = []
    for position in positions:
        prim = s.prims[position][1]
        reads += [new_record(Operand, (Role.SAVED, values.tensor_of[value], -1, value, False))
                  for value in (prim.output, *prim.inputs) if value in kept]
        reads += [new_record(Operand, (spec.role, spec.tensor, position, -1, False))
                  for spec in p.params_at.get(position, ()) if spec.region == Region.PARAMS]
        reads += [new_record(Operand, (role, tid, position, -1, False))
                  for role, tid in forward.saved_extras.get(position, ())]
    return list(dict.fromkeys(reads))


def _fused_workspace(s, make, extras_of, positions, kept, graph) -> list[Operand]:
    """Recomputed internal values and internal gradients live only inside the fused backward op."""
    writes = []
    internal = [s.prims[position][1] for position in positions]
    last = internal[-1].output
    for prim in internal:
        value = prim.output
        if value != last and value not in kept:
            writes.append(new_record(Operand, (Role.RECOMPUTE, make.sized(f"{graph}.r{value}", Region.TRANSIENT,
                                                                          s.act_dtype, s.value_slots[graph][value],
                                                                          graph), -1, value, False)))
        if value != last:
            writes.append(new_record(Operand, (Role.GRAD, make.sized(f"{graph}.g{value}", Region.TRANSIENT, s.act_dtype,
                                                                     s.value_slots[graph][value], graph),
                                               -1, value, False)))
    for position in positions:
        if position in extras_of:
            made = _extra_tensors(s, make, s.prims[position][1], extras_of[position], graph, "b")
            writes += [new_record(Operand, (role, tid, position, -1, False)) for role, tid, _ in made]
    return writes


def optimizer_op(p: Persistent, index: int) -> Op:
    """One update of every trainable parameter; the state tensors slot by slot."""
    trainable = [spec for spec in p.params if spec.grad >= 0]
    slots = len(trainable[0].state) if trainable else 0
    state_role, param_role, grad_role = Role.STATE, Role.PARAM, Role.GRAD
    state = [new_record(Operand, (state_role, spec.state[slot], -1, -1, False)) for slot in range(slots)
             for spec in trainable]
    params = [new_record(Operand, (param_role, spec.tensor, -1, -1, False)) for spec in trainable]
    reads = [new_record(Operand, (grad_role, spec.grad, -1, -1, False)) for spec in trainable] + params + state
    reads += [Operand(Role.LR, p.io["lr"]), Operand(Role.STEP, p.io["step"])]
    writes = params + state + [Operand(Role.STEP, p.io["step"])]
    return Op(index, "optimizer", "optimizer", -1, "optimizer", tuple(reads), tuple(writes))


# ---- one graph ------------------------------------------------------------------------------------
def build_graph(s: Setting, p: Persistent, graph: str, first: int) -> tuple[ComputationGraph, tuple[TensorSpec, ...]]:
    """The schedule of `graph` ("train": forward, loss, backward, optimizer; "eval": forward, loss) and
    the step-local tensors it made, with ids from `first`."""
    train = graph == "train"
    extras_of = graph_extras(s, p, graph)
    values = value_tensors(s, p, graph, saved_values(s) if train else frozenset(), first)
    forward = forward_ops(s, p, values, extras_of, graph, first + len(values.tensors))
    loss = loss_op(s, p, graph, len(forward.ops), first + len(values.tensors) + len(forward.tensors))
    ops, tensors = forward.ops + (loss.op,), values.tensors + forward.tensors + loss.tensors
    if not train:
        return ComputationGraph(graph, ops), tensors
    boundary = len(ops)
    backward = backward_ops(s, p, values, forward, extras_of, loss, graph, boundary, first + len(tensors))
    ops += backward.ops + (optimizer_op(p, boundary + len(backward.ops)),)
    return ComputationGraph(graph, ops, boundary), tensors + backward.tensors
