"""Static offset allocator for transient tensors — the pure-Python twin.

Algorithm (greedy by size, best fit; TFLite's "greedy by size", the XLA heap
simulator's idea):

1. Round every size up to the alignment.
2. Order the tensors by (aligned size descending, first op ascending, index
   ascending), a total order, so the plan is fully deterministic.
3. Place them one by one. The tensors already placed whose lifetimes intersect
   the new one's occupy intervals ``[offset, offset + size)``; walk those in
   offset order, look at the gaps between them (and the unbounded gap above the
   highest), take the smallest gap that fits, lowest offset on a tie.

``arena_bytes`` is the highest end of any placed tensor. The lower bound is the
largest total of aligned sizes live at any one op (an event sweep); no
allocator can beat it. Greedy by size stays within 1.05x of it on ResNet-sized
training schedules but not on short chains: 1.5x on a 3-layer one (see tests).

Never planned: zero-size tensors (offset 0, they occupy nothing and conflict
with nothing). Lifetimes are inclusive op indices, so two tensors conflict iff
``a.first <= b.last and b.first <= a.last``; a tensor that dies at op t and one
born at op t do conflict.

This module is the living definition of the algorithm; ``planner._memory_c`` is
the same algorithm in Cython and the tests assert bit-identical results.
"""
from __future__ import annotations

import bisect

import numpy as np

DEFAULT_ALIGNMENT = 256
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_ARENA_BYTES = 2**62  # keeps every offset + size far from int64 overflow
MAX_ALIGNMENT = 2**30


def check_problem(sizes, first, last, alignment):
    """Validate a problem and return ``(aligned sizes int64, first int32, last int32)``.

    Shared by both implementations so they reject exactly the same inputs.
    """
    if isinstance(alignment, (bool, np.bool_)) or not isinstance(alignment, (int, np.integer)):
        raise ValueError(f"alignment must be a positive integer number of bytes, got {alignment!r}")
    if not 1 <= alignment <= MAX_ALIGNMENT:
        raise ValueError(f"alignment must be between 1 and {MAX_ALIGNMENT} bytes, got {alignment}")
    sizes, first, last = (_integer_vector(name, v) for name, v in (("sizes", sizes), ("first", first), ("last", last)))
    if not len(sizes) == len(first) == len(last):
        raise ValueError(f"sizes, first and last must have equal lengths, got {len(sizes)}, {len(first)}, {len(last)}")
    _reject_first(sizes < 0, "sizes must be non-negative", sizes=sizes)
    _reject_first(sizes > MAX_ARENA_BYTES, f"sizes must be at most {MAX_ARENA_BYTES} bytes", sizes=sizes)
    for name, ops in (("first", first), ("last", last)):
        _reject_first((ops < INT32_MIN) | (ops > INT32_MAX), f"{name} must fit in int32 op indices", **{name: ops})
    _reject_first(first > last, "every lifetime needs first <= last", first=first, last=last)
    alignment = int(alignment)
    aligned = (sizes + (alignment - 1)) // alignment * alignment
    if float(aligned.sum(dtype=np.float64)) > MAX_ARENA_BYTES:
        raise ValueError(f"the tensors need more than {MAX_ARENA_BYTES} bytes without reuse; that is not supported")
    return np.ascontiguousarray(aligned), first.astype(np.int32), last.astype(np.int32)


def _integer_vector(name, values):
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    if array.dtype == np.uint64 and (array > np.uint64(2**63 - 1)).any():
        raise ValueError(f"{name} holds a value that does not fit in int64: {int(array.max())}")
    return array.astype(np.int64)


def _reject_first(bad, message, **columns):
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        found = ", ".join(f"{name}={int(column[i])}" for name, column in columns.items())
        raise ValueError(f"{message}, but tensor {i} has {found}")


def assign_offsets(sizes, first, last, alignment=DEFAULT_ALIGNMENT):
    """Offsets (int64, multiples of ``alignment``) and the arena size in bytes."""
    aligned, first, last = check_problem(sizes, first, last, alignment)
    aligned, first, last = aligned.tolist(), first.tolist(), last.tolist()
    order = sorted(range(len(aligned)), key=lambda i: (-aligned[i], first[i], i))
    offsets = [0] * len(aligned)
    placed = []  # (offset, end, first, last), kept sorted by offset
    arena = 0
    for i in order:
        size = aligned[i]
        if size == 0:
            continue
        best_offset, best_gap, prev_end = -1, 0, 0
        for p_offset, p_end, p_first, p_last in placed:
            if p_first > last[i] or p_last < first[i]:
                continue
            gap = p_offset - prev_end
            if gap >= size and (best_offset < 0 or gap < best_gap):
                best_offset, best_gap = prev_end, gap
            prev_end = max(prev_end, p_end)
        offset = prev_end if best_offset < 0 else best_offset
        offsets[i] = offset
        bisect.insort(placed, (offset, offset + size, first[i], last[i]))
        arena = max(arena, offset + size)
    return np.asarray(offsets, dtype=np.int64), arena


def live_lower_bound(sizes, first, last, alignment=DEFAULT_ALIGNMENT):
    """Largest total of aligned sizes live at any one op; a bound no allocator can beat."""
    aligned, first, last = check_problem(sizes, first, last, alignment)
    events = []  # (op, 0 = free / 1 = allocate, delta); frees at an op come before allocations
    for size, f, l in zip(aligned.tolist(), first.tolist(), last.tolist()):
        events.append((f, 1, size))
        events.append((l + 1, 0, -size))
    live = peak = 0
    for _, _, delta in sorted(events):
        live += delta
        peak = max(peak, live)
    return peak
