"""Static offset allocator for transient tensors. One source in Cython's pure-Python mode:
`setup.py` compiles it (typed by `_memory.pxd`) into the fast path; imported uncompiled it is
the oracle, and the fallback on a tree that was never built.

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

How step 3 avoids scanning every placed tensor (the same code compiled or not):

- A *shelf* is a run of placed tensors kept sorted by offset, so the tensors that
  conflict with a new one come out of one linear scan already in offset order.
  An exact fit ends the scan early: nothing later can beat it.
- The schedule is cut into ``TIME_BUCKETS`` equal spans with one shelf each,
  holding every placed tensor that touches the span, besides the shelf of all
  placed tensors. A tensor whose lifetime fits in one span searches only that
  span's shelf, which holds every tensor it can conflict with; one that crosses a
  span boundary searches the shelf of all. Short-lived tensors, the bulk of a
  training step's transients, so scan a small fraction of the placed tensors.
- The shelf of all is only searched by those crossing tensors, so new tensors
  wait on a pending shelf and are merged in (one pass) just before such a search.

Shelves live in four flat ``array('q')`` pools (offset, end, first, last of each
placed tensor): compiled code reads them as typed memoryviews, plain Python indexes
them as fast as a list.
"""
from __future__ import annotations

from array import array

import numpy as np

DEFAULT_ALIGNMENT = 256
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_ARENA_BYTES = 2**62  # keeps every offset + size far from int64 overflow
MAX_ALIGNMENT = 2**30
TIME_BUCKETS = 32  # more spans scan less but copy long-lived tensors into more shelves


def check_problem(sizes, first, last, alignment):
    """Validate a problem and return ``(aligned sizes int64, first int32, last int32)``."""
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
    vector = np.asarray(values)
    if vector.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {vector.shape}")
    if vector.size == 0:
        return np.zeros(0, dtype=np.int64)
    if vector.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integers, got dtype {vector.dtype}")
    if vector.dtype == np.uint64 and (vector > np.uint64(2**63 - 1)).any():
        raise ValueError(f"{name} holds a value that does not fit in int64: {int(vector.max())}")
    return vector.astype(np.int64)


def _reject_first(bad, message, **columns):
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        found = ", ".join(f"{name}={int(column[i])}" for name, column in columns.items())
        raise ValueError(f"{message}, but tensor {i} has {found}")


def _int64s(values):
    """An ``array('q')`` copy of a NumPy vector."""
    out = array("q")
    out.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())
    return out


def assign_offsets(sizes, first, last, alignment=DEFAULT_ALIGNMENT):
    """Offsets (int64, multiples of ``alignment``) and the arena size in bytes."""
    aligned, first, last = check_problem(sizes, first, last, alignment)
    order = np.lexsort((first, -aligned))  # size desc, first asc, then index asc: lexsort is stable
    offsets = array("q", bytes(8 * len(aligned)))
    arena = _place(_int64s(aligned), _int64s(first), _int64s(last), _int64s(order), offsets)
    return np.array(offsets, dtype=np.int64), int(arena)


def live_lower_bound(sizes, first, last, alignment=DEFAULT_ALIGNMENT):
    """Largest total of aligned sizes live at any one op; a bound no allocator can beat."""
    aligned, first, last = check_problem(sizes, first, last, alignment)
    # Event keys op * 2 + (0 free, 1 allocate): frees at an op come before its allocations. Order
    # within one key cannot change the peak: all its deltas share a sign.
    keys = np.concatenate((first.astype(np.int64) * 2 + 1, (last.astype(np.int64) + 1) * 2))
    deltas = np.concatenate((aligned, -aligned))
    return int(np.cumsum(deltas[np.argsort(keys, kind="stable")]).max(initial=0))


def _place(aligned, first, last, order, offsets):
    """Step 3 for every tensor in ``order``; writes ``offsets`` and returns the arena size."""
    n = len(order)
    planned = 0
    t0 = t1 = 0
    for k in range(n):
        if aligned[k] > 0:
            if planned == 0 or first[k] < t0:
                t0 = first[k]
            if planned == 0 or last[k] > t1:
                t1 = last[k]
            planned += 1
    if planned == 0:
        return 0
    span = (t1 - t0 + TIME_BUCKETS) // TIME_BUCKETS  # ceil((t1 - t0 + 1) / TIME_BUCKETS)
    n_buckets = (t1 - t0) // span + 1
    everything, pending = n_buckets, n_buckets + 1
    # Shelf g's entries start at start[g]; its capacity is the number of tensors that touch span g.
    start = array("q", bytes(8 * (n_buckets + 3)))
    count = array("q", bytes(8 * (n_buckets + 2)))
    for k in range(n):
        if aligned[k] > 0:
            for g in range((first[k] - t0) // span, (last[k] - t0) // span + 1):
                start[g + 1] += 1
    start[everything + 1] = planned
    start[pending + 1] = planned
    for g in range(n_buckets + 2):
        start[g + 1] += start[g]
    pool_bytes = bytes(8 * start[n_buckets + 2])
    shelf_offset, shelf_end = array("q", pool_bytes), array("q", pool_bytes)
    shelf_first, shelf_last = array("q", pool_bytes), array("q", pool_bytes)
    live = array("q", bytes(8 * planned))
    arena = 0
    for k in range(n):
        i = order[k]
        size = aligned[i]
        if size == 0:
            break  # sizes descend, so only zero-size tensors remain; they stay at offset 0
        f = first[i]
        l = last[i]
        g0 = (f - t0) // span
        g1 = (l - t0) // span
        if g0 == g1:
            offset = _best_fit(shelf_offset, shelf_end, shelf_first, shelf_last, start[g0], count[g0], size, f, l,
                               live)
        else:
            _merge(shelf_offset, shelf_end, shelf_first, shelf_last, start[everything], count[everything],
                   start[pending], count[pending])
            count[everything] += count[pending]
            count[pending] = 0
            offset = _best_fit(shelf_offset, shelf_end, shelf_first, shelf_last, start[everything],
                               count[everything], size, f, l, live)
        offsets[i] = offset
        if offset + size > arena:
            arena = offset + size
        for g in range(g0, g1 + 1):
            _insert(shelf_offset, shelf_end, shelf_first, shelf_last, start[g], count[g], offset, offset + size, f, l)
            count[g] += 1
        _insert(shelf_offset, shelf_end, shelf_first, shelf_last, start[pending], count[pending], offset,
                offset + size, f, l)
        count[pending] += 1
    return arena


def _best_fit(offsets, ends, firsts, lasts, start, count, size, f, l, live):
    """Offset of the smallest gap that fits ``size`` among the shelf's tensors live in [f, l]
    (``live`` is scratch room for ``count`` indices)."""
    n_live = 0
    for j in range(start, start + count):  # compiled, branch-free: whether a tensor is live is hard to predict
        live[n_live] = j
        n_live += (firsts[j] <= l) & (lasts[j] >= f)
    best_offset = -1
    best_gap = 0
    prev_end = 0
    for k in range(n_live):
        j = live[k]
        gap = offsets[j] - prev_end
        if gap >= size and (best_offset < 0 or gap < best_gap):
            best_offset = prev_end
            best_gap = gap
            if gap == size:
                return best_offset  # an exact fit at the lowest such offset: nothing later beats it
        if ends[j] > prev_end:
            prev_end = ends[j]
    return prev_end if best_offset < 0 else best_offset


def _insert(offsets, ends, firsts, lasts, start, count, offset, end, f, l):
    """Insert one entry into the shelf of ``count`` entries at ``start``, after every lower or equal offset."""
    stop = start + count
    at = _upper_bound(offsets, start, stop, offset)
    if at < stop:  # not above every entry: make room
        _shift(offsets, at, stop, 1)
        _shift(ends, at, stop, 1)
        _shift(firsts, at, stop, 1)
        _shift(lasts, at, stop, 1)
    offsets[at] = offset
    ends[at] = end
    firsts[at] = f
    lasts[at] = l


def _merge(offsets, ends, firsts, lasts, into, count, source, n_source):
    """Merge the sorted shelf at ``source`` into the one at ``into`` (room for both), from the back,
    so every entry moves at most once."""
    stop = into + count  # entries at or above `stop` are in their final place
    for b in range(n_source - 1, -1, -1):
        offset = offsets[source + b]
        at = _upper_bound(offsets, into, stop, offset)
        if at < stop:
            _shift(offsets, at, stop, b + 1)
            _shift(ends, at, stop, b + 1)
            _shift(firsts, at, stop, b + 1)
            _shift(lasts, at, stop, b + 1)
        offsets[at + b] = offset
        ends[at + b] = ends[source + b]
        firsts[at + b] = firsts[source + b]
        lasts[at + b] = lasts[source + b]
        stop = at


def _upper_bound(offsets, lo, hi, offset):
    """The first index in [lo, hi) whose offset is above ``offset`` (hi if none): sorted ``offsets``."""
    if lo == hi or offsets[hi - 1] <= offset:
        return hi  # above every entry: the common case, tensors stack up while they all live
    while lo < hi:
        mid = (lo + hi) // 2
        if offsets[mid] <= offset:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _shift(values, lo, hi, by):
    """Move ``values[lo:hi]`` up by ``by`` places (overlapping, so from the top down)."""
    for j in range(hi - 1, lo - 1, -1):
        values[j + by] = values[j]
