"""`summary(bp, input_shape, depth=2)`: a torchinfo-like table built on the planner's compiled plan.

One row per module path (the layer names, which follow torchvision's `state_dict` names for zoo
models: `layer1.0.conv1`), collapsed to `depth` components (`depth=1`: `layer1`), with the output
shape of the group's last layer, its parameters and MACs; then the trainable and non-trainable
(BatchNorm running statistics) counts and the memory plan's totals (arena, saved for backward,
transient), which torchinfo cannot give. `blueprint plan --depth N` prints the same table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MIB = 1 << 20
DEFAULT_DEPTH = 2


@dataclass(frozen=True)
class SummaryRow:
    path: str
    kind: str
    layers: int
    output_shape: tuple
    params: int
    macs: int            # for the whole batch


def compile_plan(bp, input_shape, batch: int, eval_batch: int, fuse: bool = False, amp: bool = False,
                 optimizer_state_slots: int = 1):
    """Expand and compile a train and an eval variant of `bp` for one sample shape (H, W, C); verified."""
    from planner import ArchPlan
    from planner.compiler import Compiler

    height, width, channels = input_shape
    _refuse_channels_first(tuple(input_shape))
    arch = ArchPlan.from_blueprint(bp, in_channels=channels, fuse=fuse, amp=amp)
    plan = Compiler(arch).compile(variants={"train": (batch, height, width, channels),
                                            "eval": (eval_batch, height, width, channels)},
                                  training=True, optimizer_state_slots=optimizer_state_slots)
    plan.verify()
    return plan


def _refuse_channels_first(sample) -> None:
    """(3, 224, 224) or (1, 28, 28) is PyTorch's (C, H, W) of a square image, not an NHWC sample of 3 rows
    and 224 channels: refuse it with the NHWC shape instead of planning a network nobody meant."""
    height, width, channels = sample
    if height in (1, 3, 4) and width == channels and width >= 8:
        raise ValueError(f"input shape {sample} looks like PyTorch's (C, H, W); blueprint takes NHWC samples "
                         f"(H, W, C): pass {(width, channels, height)}")


def layer_rows(plan) -> list[dict]:
    """One row per layer of the ArchPlan: the primitives, or in a fused plan the fused layers with
    totals over their sub-primitives (`plan.primitives` lists those in the same order)."""
    trainable = [0] * len(plan.primitives)
    for param in plan.params:
        if param.region == "params":
            trainable[param.layer] += math.prod(param.shape)
    shapes = plan.value_shapes["train"]
    rows, position = [], 0
    for layer in plan.arch.layers:
        members = range(position, position + len(layer.sub or (layer,)))
        position = members.stop
        rows.append({"name": layer.name, "kind": layer.kind, "out_shape": list(shapes[layer.output]),
                     "params": sum(trainable[p] for p in members),
                     "macs": sum(plan.macs_per_sample[p] for p in members)})
    return rows


def summary_rows(plan, depth: int | None) -> list[SummaryRow]:
    """The layer rows grouped by the first `depth` components of their names, in order of appearance
    (`None`: every layer on its own row)."""
    if depth is not None:
        _check_depth(depth)
    batch = plan.variants["train"].input_shape[0]
    groups: dict[str, list[dict]] = {}
    for row in layer_rows(plan):
        path = row["name"] if depth is None else ".".join(row["name"].split(".")[:depth])
        groups.setdefault(path, []).append(row)
    return [SummaryRow(path, members[0]["kind"] if len(members) == 1 else "group", len(members),
                       tuple(members[-1]["out_shape"]), sum(r["params"] for r in members),
                       batch * sum(r["macs"] for r in members))
            for path, members in groups.items()]


def non_trainable_params(plan) -> int:
    """Numbers that are state but not trained: the BatchNorm running statistics and their counters."""
    return sum(math.prod(p.shape) for p in plan.params if p.region != "params")


def cpu_conv_algorithms(plan) -> dict[str, str]:
    """Layer name -> the CPU algorithm of each direction the plan recorded for a convolution (its ops'
    ``conv`` attr, `planner.conv_algorithm`); fused plans run no CPU kernels and record none."""
    return {op.name: str(op.attr("conv")) for op in plan.graphs["train"].ops
            if op.direction == "forward" and op.attr("conv") is not None}


def format_summary(plan, depth: int | None = DEFAULT_DEPTH, title: str = "") -> str:
    """The table, the parameter counts and the memory totals of a compiled plan (`depth=None`: every layer,
    with the CPU algorithm of each convolution)."""
    rows = summary_rows(plan, depth)
    header = ["module" if depth is None else f"module (depth {depth})", "kind", "layers", "output shape", "params", "MACs"]
    cells = [[r.path, r.kind, str(r.layers), str(r.output_shape), f"{r.params:,}", f"{r.macs:,}"] for r in rows]
    algorithms = cpu_conv_algorithms(plan) if depth is None else {}
    if algorithms:
        header.append("CPU algorithm")
        for row, cell in zip(rows, cells):
            cell.append(algorithms.get(row.path, ""))
    table = text_table(header, cells, numeric={2, 4, 5})
    memory = plan.memory
    trainable, frozen = plan.params_trainable, non_trainable_params(plan)
    batch = plan.variants["train"].input_shape
    lines = ([title] if title else []) + [table, "",
             f"trainable params:     {trainable:,}",
             f"non-trainable params: {frozen:,} (BatchNorm running statistics)",
             f"total params:         {trainable + frozen:,}",
             f"forward MACs for input {batch}: {sum(r.macs for r in rows):,}",
             f"memory plan (train step, one arena): {_mib(memory.arena_bytes)} in all; saved for backward "
             f"{_mib(memory.saved_for_backward_bytes)}; transient {_mib(memory.transient_planned_bytes)} "
             f"(lower bound {_mib(memory.transient_lower_bound_bytes)})"]
    return "\n".join(lines)


def summary(bp, input_shape, depth: int = DEFAULT_DEPTH, *, fuse: bool = False, amp: bool = False) -> str:
    """A torchinfo-like summary of `bp` for `input_shape`, (H, W, C) for one sample or (N, H, W, C).

    >>> from blueprint import zoo
    >>> print(summary(zoo.resnet18(), (224, 224, 3), depth=1))     # doctest: +SKIP
    module (depth 1)  kind   layers  output shape        params          MACs
    ...
    trainable params:     11,689,512
    """
    shape = tuple(input_shape)
    if len(shape) not in (3, 4) or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape):
        raise ValueError(f"summary(bp, input_shape): expected (H, W, C) or (N, H, W, C) positive ints (NHWC), "
                         f"found {input_shape!r}; pass e.g. (224, 224, 3)")
    batch, sample = (1, shape) if len(shape) == 3 else (shape[0], shape[1:])
    _check_depth(depth)
    plan = compile_plan(bp, sample, batch, batch, fuse=fuse, amp=amp)
    return format_summary(plan, depth)


def _check_depth(depth) -> None:
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"summary depth: expected an int >= 1, found {depth!r}; pass e.g. depth=2")


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:,.2f} MiB"


def text_table(header: list[str], rows: list[list[str]], numeric=frozenset()) -> str:
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]

    def line(cells):
        return "  ".join(str(c).rjust(w) if i in numeric else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(row) for row in rows])
