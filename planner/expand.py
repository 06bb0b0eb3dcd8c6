"""`ArchPlan.from_blueprint`: expand the tree, then run the normalisation passes in order.

    expand_tree            tree -> primitives (`planner._expand`: compiled, or its source uncompiled)
    drop_identities        identity layers become aliases of their input
    normalise_flatten      flatten of a 2-D value is dropped; fc on a 4-D value gets an explicit flatten
    resolve_batchnorm_rank bn -> bn2d after NHWC values, bn1d after (N, F) values
    append_loss_head       softmax-cross-entropy on the network output, exactly once
    align_input_channels   AMP: the input's channels are padded to a multiple of 8 (the stem's aligned GEMMs)
    check_fused_channels   fuse: every fused convolution's channels must be multiples of 8
    merge_blocks           fuse: block / mbconv primitives -> BasicBlock, Bottleneck, InvResidual
    merge_triples          fuse: conv + bn2d + relu -> CBR
    merge_pairs            fuse: gap + fc -> GapFc
    mark_first_layer       layers reading the network input need no input gradient
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from blueprint._layer import BluePrint, Layer
from planner._arch import NETWORK_INPUT, ArchLayer, ArchPlan
from planner._build import load
from planner._expand_error import ExpandError

INPUT_CHANNEL_ALIGNMENT = 8   # fp16 16-byte rows: a convolution runs the aligned tensor-core kernels (zeros in the rest)
FUSED_CHANNEL_MULTIPLE = 8    # fused fp16 kernels vectorise channels by 8


def _expander():
    return load("planner._expand").expand_tree


def _to_layers(records) -> list[ArchLayer]:
    return [ArchLayer(kind, params, inputs, output, in_ch, out_ch, rank, prefix, path, group, group_kind)
            for kind, params, inputs, output, in_ch, out_ch, rank, prefix, path, group, group_kind in records]


def _rename_inputs(layers: list[ArchLayer], alias: dict[int, int]) -> list[ArchLayer]:
    def resolve(value: int) -> int:
        while value in alias:
            value = alias[value]
        return value

    def renamed(layer: ArchLayer) -> ArchLayer:  # replace() only where an input changes: it is slow
        inputs = tuple(resolve(v) for v in layer.inputs)
        return layer if inputs == layer.inputs else replace(layer, inputs=inputs)
    return [renamed(l) for l in layers] if alias else list(layers)


def drop_identities(layers: list[ArchLayer]) -> list[ArchLayer]:
    alias = {l.output: l.inputs[0] for l in layers if l.kind == "identity"}
    return _rename_inputs([l for l in layers if l.kind != "identity"], alias)


def normalise_flatten(layers: list[ArchLayer]) -> list[ArchLayer]:
    rank_of = {NETWORK_INPUT: 4}
    rank_of.update({l.output: l.rank for l in layers})
    next_value = max([l.output for l in layers] + [0]) + 1
    alias: dict[int, int] = {}
    out: list[ArchLayer] = []
    for layer in layers:
        if alias and any(v in alias for v in layer.inputs):
            layer = replace(layer, inputs=tuple(alias.get(v, v) for v in layer.inputs))
        source_rank = rank_of[layer.inputs[0]] if layer.inputs else 4
        if layer.kind == "flatten" and source_rank == 2:
            alias[layer.output] = layer.inputs[0]
            continue
        if layer.kind == "fc" and source_rank == 4:
            flat = ArchLayer("flatten", (), layer.inputs, next_value, layer.in_channels, -1, 2,
                             layer.prefix, layer.path + ".flatten", layer.group, layer.group_kind)
            rank_of[next_value] = 2
            out.append(flat)
            layer = replace(layer, inputs=(next_value,))
            next_value += 1
        out.append(layer)
    return out


def resolve_batchnorm_rank(layers: list[ArchLayer]) -> list[ArchLayer]:
    rank_of = {NETWORK_INPUT: 4}
    rank_of.update({l.output: l.rank for l in layers})
    return [replace(l, kind="bn2d" if rank_of[l.inputs[0]] == 4 else "bn1d") if l.kind == "bn" else l for l in layers]


def append_loss_head(layers: list[ArchLayer]) -> list[ArchLayer]:
    if any(l.kind == "softmax_ce" for l in layers):
        raise ExpandError("the plan already has a loss head; append_loss_head runs once")
    if not layers:
        raise ExpandError("the network must end with (N, classes) logits, but it has no layers once its identity "
                          "layers are dropped (it only passes its input through); add layers that compute logits, "
                          "e.g. seq(conv(16, 3, 1, 1), gap(), fc(classes))")
    last = layers[-1]
    if last.rank != 2:
        raise ExpandError(f"{last.path}: the network must end with (N, classes) logits, but its last layer "
                          f"`{last.kind}` outputs an NHWC tensor; end it with gap() + fc(classes)")
    loss_value = max(l.output for l in layers) + 1
    head = ArchLayer("softmax_ce", (), (last.output,), loss_value, last.out_channels, 1, 0, "", "loss")
    return layers + [head]


def align_input_channels(in_channels: int, amp: bool) -> int:
    return -(-in_channels // INPUT_CHANNEL_ALIGNMENT) * INPUT_CHANNEL_ALIGNMENT if amp else in_channels


def check_fused_channels(layers: list[ArchLayer]) -> None:
    for layer in layers:
        if layer.group_kind not in ("basic_block", "bottleneck", "inv_residual", "cbr") or layer.kind != "conv":
            continue
        checked = [("output", layer.out_channels)] + ([] if NETWORK_INPUT in layer.inputs else [("input", layer.in_channels)])
        for side, channels in checked:
            if channels % FUSED_CHANNEL_MULTIPLE:
                raise ExpandError(f"{layer.path}: fused fp16 kernels need channel counts that are multiples of "
                                  f"{FUSED_CHANNEL_MULTIPLE}, but this convolution's {side} has {channels}; "
                                  f"insert channel_padding({FUSED_CHANNEL_MULTIPLE}) before it or change the width")


def _use_counts(layers: list[ArchLayer]) -> Counter:
    return Counter(v for l in layers for v in l.inputs)


def _fused(kind: str, members: list[ArchLayer], params: tuple) -> ArchLayer:
    produced = {m.output for m in members}
    inputs = []
    for m in members:
        inputs += [v for v in m.inputs if v not in produced and v not in inputs]
    head, tail = members[0], members[-1]
    return ArchLayer(kind, params, tuple(inputs), tail.output, head.in_channels, tail.out_channels, tail.rank,
                     tail.prefix, tail.path.rsplit(".", 1)[0] if head.group >= 0 else head.path, head.group,
                     head.group_kind, sub=tuple(members))


def merge_blocks(layers: list[ArchLayer]) -> list[ArchLayer]:
    out: list[ArchLayer] = []
    index = 0
    while index < len(layers):
        layer = layers[index]
        if layer.group_kind not in ("basic_block", "bottleneck", "inv_residual"):
            out.append(layer)
            index += 1
            continue
        end = index
        while end < len(layers) and layers[end].group == layer.group:
            end += 1
        members = layers[index:end]
        convs = [m for m in members if m.kind == "conv"]
        has_add = any(m.kind == "add" for m in members)
        if layer.group_kind == "inv_residual":
            shortcut = "identity" if has_add else "none"
        else:
            shortcut = "projection" if len(convs) > (3 if layer.group_kind == "bottleneck" else 2) else "identity"
        out.append(_fused(layer.group_kind, members, (("shortcut", shortcut),)))
        index = end
    return out


def _merge_chains(layers: list[ArchLayer], kinds: list[str], fused_kind: str, also) -> list[ArchLayer]:
    """Fuse every run of consecutive layers of `kinds` in which each layer reads only the previous one's
    output, that output has no other use, and `also(run)` holds, into one `fused_kind` layer."""
    uses = _use_counts(layers)
    out: list[ArchLayer] = []
    index = 0
    while index < len(layers):
        run = layers[index:index + len(kinds)]
        if ([l.kind for l in run] == kinds
                and all(b.inputs == (a.output,) and uses[a.output] == 1 for a, b in zip(run, run[1:]))
                and also(run)):
            out.append(_fused(fused_kind, run, ()))
            index += len(run)
        else:
            out.append(layers[index])
            index += 1
    return out


def merge_triples(layers: list[ArchLayer]) -> list[ArchLayer]:
    return _merge_chains(layers, ["conv", "bn2d", "relu"], "cbr", lambda run: run[0].param("groups") == 1)


def merge_pairs(layers: list[ArchLayer]) -> list[ArchLayer]:
    return _merge_chains(layers, ["gap", "fc"], "gap_fc", lambda run: run[0].group_kind != "se")  # an se stays unfused


def mark_first_layer(layers: list[ArchLayer]) -> list[ArchLayer]:
    return [replace(l, first=True) if NETWORK_INPUT in l.inputs else l for l in layers]


def arch_plan_from_blueprint(bp: BluePrint, in_channels: int = 3, fuse: bool = False, amp: bool = False) -> ArchPlan:
    """Flatten a BluePrint into an `ArchPlan` (see the module docstring for the passes).

    >>> from blueprint import zoo
    >>> plan = ArchPlan.from_blueprint(zoo.resnet20())
    >>> [l.kind for l in plan.layers[:3]]
    ['conv', 'bn2d', 'relu']
    """
    if not isinstance(bp, BluePrint):
        fix = "; wrap the layer as BluePrint(layer)" if isinstance(bp, Layer) else ", e.g. BluePrint(seq(...))"
        raise TypeError(f"ArchPlan.from_blueprint(bp): expected a BluePrint, got {type(bp).__name__}{fix}")
    if bp.empty:
        raise ValueError("ArchPlan.from_blueprint(bp): the BluePrint is empty; build one with BluePrint(seq(...))")
    if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
        raise ValueError(f"ArchPlan.from_blueprint(in_channels): expected a positive int, got {in_channels!r}")
    if fuse and not amp:
        raise ValueError("ArchPlan.from_blueprint(fuse=True) needs amp=True: the fused kernels are fp16-only; "
                         "pass amp=True, or fuse=False for the fp32 reference path")
    passes = ["expand_tree", "drop_identities", "normalise_flatten", "resolve_batchnorm_rank", "append_loss_head"]
    layers = _to_layers(_expander()(bp.root, in_channels))
    layers = drop_identities(layers)
    layers = normalise_flatten(layers)
    layers = resolve_batchnorm_rank(layers)
    layers = append_loss_head(layers)
    padded = align_input_channels(in_channels, amp)
    if amp:
        passes.append("align_input_channels")
    if fuse:
        check_fused_channels(layers)
        layers = merge_blocks(layers)
        layers = merge_triples(layers)
        layers = merge_pairs(layers)
        passes += ["check_fused_channels", "merge_blocks", "merge_triples", "merge_pairs"]
    layers = mark_first_layer(layers)
    passes.append("mark_first_layer")
    return ArchPlan(tuple(layers), in_channels, padded, fuse, amp, tuple(passes))
