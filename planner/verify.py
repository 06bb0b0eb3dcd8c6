"""An independent checker of a CompiledPlan's memory plan.

It does not trust the planner's bookkeeping: it recomputes every tensor's lifetime from
the op schedule and then fails if
  - an op reads a step-local tensor before any op of the same graph wrote it,
  - two step-local tensors of one graph that are live at the same time overlap in memory,
  - two persistent tensors overlap, or a tensor leaves its region or the arena,
  - a tensor's slot is smaller than its shape in some variant.

It imports nothing of the planner's (a CompiledPlan's `verify()` imports it): the records say
themselves what they are (`Region.persistent`, numpy dtypes).
"""
from __future__ import annotations

import math

import numpy as np


class PlanError(AssertionError):
    """The memory plan is unsound; the message names the tensors and ops involved."""


def _overlaps(starts: np.ndarray, ends: np.ndarray, firsts: np.ndarray, lasts: np.ndarray):
    """Pairs (i, j), i < j, overlapping in memory and (where lifetimes are given) in time."""
    order = np.argsort(starts, kind="stable")
    starts, ends, firsts, lasts = starts[order], ends[order], firsts[order], lasts[order]
    pairs = []
    for i in range(len(order)):
        # candidates: tensors starting before this one ends (sorted by start, so a prefix after i)
        stop = np.searchsorted(starts, ends[i], side="left")
        if stop <= i + 1:
            continue
        j = np.arange(i + 1, stop)
        hit = (starts[j] < ends[i]) & (firsts[j] <= lasts[i]) & (firsts[i] <= lasts[j])
        pairs += [(int(order[i]), int(order[k])) for k in j[hit]]
    return pairs


def verify_plan(plan) -> None:
    tensors = plan.tensors
    arena = plan.memory.arena_bytes
    regions = plan.memory.regions
    for t in tensors:
        start, size = regions[t.region]
        if t.offset < start or t.offset + t.nbytes > start + size or t.offset + t.nbytes > arena:
            raise PlanError(f"tensor {t.name!r} [{t.offset}, {t.offset + t.nbytes}) leaves its region "
                            f"{t.region} [{start}, {start + size}) or the arena ({arena} bytes)")
        for variant, shape in t.variant_shapes:
            if math.prod(shape) * np.dtype(t.dtype).itemsize > t.nbytes:
                raise PlanError(f"tensor {t.name!r}: its shape {shape} in variant {variant!r} does not fit its "
                                f"slot of {t.nbytes} bytes")
    persistent = [t for t in tensors if t.region.persistent and t.nbytes]
    _check_disjoint(persistent, None)
    for name, graph in plan.graphs.items():
        written: set[int] = set()
        span: dict[int, list[int]] = {}
        local = {t.id for t in tensors if t.graph == name}
        for op in graph.ops:
            for operand in op.reads:
                tid = operand.tensor
                if tid in local and tid not in written:
                    raise PlanError(f"graph {name!r}, op {op.index} ({op.kind} {op.direction} of {op.name}) reads "
                                    f"{tensors[tid].name!r} (role {operand.label}) before any op wrote it")
            for operand in op.reads + op.writes:
                first_last = span.setdefault(operand.tensor, [op.index, op.index])
                first_last[1] = op.index
            written |= {operand.tensor for operand in op.writes}
        members = [tensors[tid] for tid in local if tid in span and tensors[tid].nbytes]
        _check_disjoint(members, span, name)


def _check_disjoint(members, span, graph: str = "") -> None:
    if not members:
        return
    starts = np.array([t.offset for t in members], dtype=np.int64)
    ends = starts + np.array([t.nbytes for t in members], dtype=np.int64)
    if span is None:
        firsts = np.zeros(len(members), dtype=np.int64)
        lasts = np.zeros(len(members), dtype=np.int64)
    else:
        firsts = np.array([span[t.id][0] for t in members], dtype=np.int64)
        lasts = np.array([span[t.id][1] for t in members], dtype=np.int64)
    pairs = _overlaps(starts, ends, firsts, lasts)
    if pairs:
        i, j = pairs[0]
        a, b = members[i], members[j]
        when = "" if span is None else (f" while both are live in graph {graph!r} (ops {span[a.id]} and {span[b.id]})")
        raise PlanError(f"tensors {a.name!r} [{a.offset}, {a.offset + a.nbytes}) and {b.name!r} "
                        f"[{b.offset}, {b.offset + b.nbytes}) overlap{when}; {len(pairs)} overlapping pair(s) in all")
