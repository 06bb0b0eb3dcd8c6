"""The memory plan: every tensor of a CompiledPlan gets (region, offset, nbytes) in one arena.

Algorithm. Persistent regions (params, weights16, grads, optim, bn_stats, io, scalars) are
laid out once, tensors back to back in plan order, each 256-byte aligned; the fp32 regions
that mirror a parameter (params, grads, optimizer state) align each tensor to 512 bytes, so
that the fp16 weight copies can sit at exactly half those offsets (still 256-aligned): grads,
optimizer state and fp16 weights mirror the parameter layout element for element, and one
kernel can sweep a whole region (the optimizer, the fp32 -> fp16 cast); after the mirror, weights16
holds the fp16 copies of convolution weights with Cin % 8 != 0 padded to 8k channels. Saved activations (written in
forward, read in backward) and transient
tensors (everything else that lives inside one step) get offsets from their lifetimes over
the op schedule: lifetimes -> best-fit allocator, greedy by size and other orders (planner.memory_alloc) ->
offsets. The eval graph's transients overlay the train graph's in the same region.
Never planned: host-side buffers (the data loader's batches) and per-kernel registers or
shared memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.memory_alloc import plan_offsets
from planner.plan import PERSISTENT_REGIONS, PLANNED_REGIONS, ParamSpec, Region, TensorSpec, new_record

ALIGNMENT = 256
MIRROR_ALIGNMENT = 2 * ALIGNMENT      # fp32 tensors with an fp16 mirror at half the offset
MIRRORED_REGIONS = (Region.PARAMS, Region.GRADS, Region.OPTIM)


def align(nbytes: int, alignment: int = ALIGNMENT) -> int:
    return -(-nbytes // alignment) * alignment


@dataclass(frozen=True, slots=True)
class GraphMemory:
    graph: str
    saved_bytes: int                    # the saved region as planned for this graph
    transient_planned_bytes: int
    transient_lower_bound_bytes: int    # max over the schedule of live transient bytes
    transient_no_reuse_bytes: int       # every transient in its own slot
    saved_for_backward_bytes: int       # bytes of step-local tensors live between forward and backward


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    regions: dict                       # name -> (offset, nbytes)
    arena_bytes: int
    graphs: dict                        # graph name -> GraphMemory

    @property
    def train(self) -> GraphMemory:
        return self.graphs.get("train") or self.graphs["eval"]

    @property
    def transient_planned_bytes(self) -> int:
        return self.regions["transient"][1]

    @property
    def transient_lower_bound_bytes(self) -> int:
        return max(g.transient_lower_bound_bytes for g in self.graphs.values())

    @property
    def transient_no_reuse_bytes(self) -> int:
        return max(g.transient_no_reuse_bytes for g in self.graphs.values())

    @property
    def fragmentation(self) -> float:
        bound = self.transient_lower_bound_bytes
        return self.transient_planned_bytes / bound - 1.0 if bound else 0.0

    @property
    def saved_for_backward_bytes(self) -> int:
        return self.graphs["train"].saved_for_backward_bytes if "train" in self.graphs else 0

    def report(self) -> str:
        lines = [f"{'region':<12}{'bytes':>16}  human"]
        for name, (_, nbytes) in self.regions.items():
            lines.append(f"{name:<12}{nbytes:>16,}  {human_bytes(nbytes)}")
        lines.append(f"{'arena':<12}{self.arena_bytes:>16,}  {human_bytes(self.arena_bytes)}")
        lines.append(f"transient: planned {human_bytes(self.transient_planned_bytes)}, lower bound "
                     f"{human_bytes(self.transient_lower_bound_bytes)}, no reuse {human_bytes(self.transient_no_reuse_bytes)}, "
                     f"fragmentation {self.fragmentation:.1%}")
        if "train" in self.graphs:
            lines.append(f"saved for backward: {human_bytes(self.saved_for_backward_bytes)}")
        return "\n".join(lines)


def human_bytes(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return f"{nbytes:.1f} GiB"


def lifetimes(graph) -> dict[int, tuple[int, int]]:
    """First and last op index touching each tensor of a graph's schedule (ops are in index order)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for op in graph.ops:
        index = op.index
        for accesses in (op.reads, op.writes):
            for operand in accesses:
                tid = operand.tensor
                if tid not in first:
                    first[tid] = index
                last[tid] = index
    return {tid: (index, last[tid]) for tid, index in first.items()}


def plan_memory(tensors: list[TensorSpec], graphs, params: tuple[ParamSpec, ...]) -> tuple[list[TensorSpec], MemoryPlan]:
    """Offsets for every sized tensor (see the module docstring); returns the placed TensorSpecs and the report.
    `params` link each fp16 weight copy to its parameter."""
    offsets: dict[int, int] = {}
    regions: dict[str, tuple[int, int]] = {}
    by_region: dict[str, list] = {region: [] for region in PERSISTENT_REGIONS}
    by_graph: dict[tuple[str, str], list] = {(name, region): [] for name in graphs for region in PLANNED_REGIONS}
    for t in tensors:
        if t.region in by_region:
            by_region[t.region].append(t)
        elif (t.graph, t.region) in by_graph:
            by_graph[t.graph, t.region].append(t)
    cursor = 0
    master_of = {spec.half: spec.tensor for spec in params if spec.half >= 0}
    for region in PERSISTENT_REGIONS:
        start = cursor
        if region == Region.WEIGHTS16:   # fp16 copy of each parameter at half its offset in the params region
            params_start, params_bytes = regions[Region.PARAMS]
            mirrored = [t for t in by_region[region] if t.id in master_of]
            for t in mirrored:
                offsets[t.id] = start + (offsets[master_of[t.id]] - params_start) // 2
            cursor += params_bytes // 2 if mirrored else 0
            for t in by_region[region]:   # then the padded copies (``half_padded``: Cin % 8 != 0), back to back
                if t.id not in master_of:
                    offsets[t.id] = cursor
                    cursor += align(t.nbytes)
        else:
            alignment = MIRROR_ALIGNMENT if region in MIRRORED_REGIONS else ALIGNMENT
            for t in by_region[region]:
                offsets[t.id] = cursor
                cursor += align(t.nbytes, alignment)
        regions[region] = (start, cursor - start)
    graph_memory = {}
    planned_size = {region: 0 for region in PLANNED_REGIONS}
    placed_members = []  # (region, members, offsets relative to the region)
    for name, graph in graphs.items():
        span = lifetimes(graph)
        per_region = {}
        boundary_bytes = 0
        for region in PLANNED_REGIONS:
            members = by_graph[name, region]
            spans = [span.get(t.id) for t in members]
            if None in spans:
                unused = [t.name for t in members if t.id not in span]
                raise AssertionError(f"planner bug: tensors {unused[:5]} of graph {name!r} are never used by an op")
            sizes = np.array([t.nbytes for t in members], dtype=np.int64)
            first_last = np.array(spans, dtype=np.int32).reshape(-1, 2)
            first, last = first_last[:, 0].copy(), first_last[:, 1].copy()
            placed, size, bound = plan_offsets(sizes, first, last, ALIGNMENT)
            placed_members.append((region, members, placed.tolist()))
            planned_size[region] = max(planned_size[region], size)
            no_reuse = int(((sizes + (ALIGNMENT - 1)) // ALIGNMENT * ALIGNMENT).sum())
            per_region[region] = (size, bound, no_reuse)
            if graph.boundary >= 0:
                boundary_bytes += int(sizes[(first < graph.boundary) & (graph.boundary <= last)].sum())
        saved, transient = per_region[Region.SAVED], per_region[Region.TRANSIENT]
        graph_memory[name] = GraphMemory(name, saved[0], transient[0], transient[1], transient[2], boundary_bytes)
    for region in PLANNED_REGIONS:
        regions[region] = (cursor, planned_size[region])
        cursor += planned_size[region]
    for region, members, placed in placed_members:
        base = regions[region][0]
        for t, off in zip(members, placed):
            offsets[t.id] = base + off
    placed_tensors = [new_record(TensorSpec, (t.id, t.name, t.region, t.dtype, t.shape, t.nbytes, offsets[t.id],
                                              t.graph, t.variant_shapes)) for t in tensors]
    return placed_tensors, MemoryPlan(regions, cursor, graph_memory)
