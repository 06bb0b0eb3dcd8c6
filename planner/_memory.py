"""Static offset allocator for transient tensors. One source in Cython's pure-Python mode:
`setup.py` compiles it (typed by `_memory.pxd`) into the fast path; imported uncompiled it is
the oracle, and the fallback on a tree that was never built.

Algorithm (greedy by size, best fit; TFLite's "greedy by size", the XLA heap
simulator's idea, with a few placement orders and the smallest arena kept):

1. Round every size up to the alignment.
2. Order the tensors by one of ``STRATEGIES``, each a total order (index
   ascending breaks the last ties), so the plan is fully deterministic:
   ``size`` (aligned size descending, first op ascending), ``size_then_longest``
   (size, then lifetime length descending), ``size_then_latest`` (size, then
   last op descending), ``breadth`` (TFLite's "greedy by breadth": the most
   bytes live at any op of the lifetime descending, then size).
3. Place them one by one. The tensors already placed whose lifetimes intersect
   the new one's occupy intervals ``[offset, offset + size)``; walk those in
   offset order, look at the gaps between them (and the unbounded gap above the
   highest), take the smallest gap that fits, lowest offset on a tie.
4. Steps 2-3 run for ``size`` first. Only if its arena is above 1.05x the
   lower bound (the project's target) do the others run, in order, until one
   reaches the bound; the smallest arena wins, the earlier strategy on a tie.
   Each order costs about one more placement (1.6-4.7 ms each, compiled, on
   the 2,000-3,000 tensor problems of `benchmarks/bench_memory_alloc.py`,
   measured), so a plan within the target, the usual case, pays for one order
   and the lower bound's event sweep.

``arena_bytes`` is the highest end of any placed tensor. The lower bound is the
largest total of aligned sizes live at any one op (an event sweep); no
allocator can beat it. ``size`` alone reaches it on every zoo training plan. It
missed mobilenet_v3_small's unfused one (1.116x) while the plan still gave the
first convolution an im2col workspace (since dropped: its algorithms need none):
there the backward pass ends with a chain of equal-size full-resolution
gradients, each live for two ops, beside that larger workspace at the last op. ``size`` places
the workspace, then the chain in time order alternating between two offsets,
and the chain's last link, live with the workspace, finds both taken; ordering
the chain from its end (``size_then_latest``) reaches the bound. On short
chains every order can miss: 1.5x on a 3-layer one (see tests), which step 5 closes.

5. Where the plan is still above the bound and at most ``EXACT_MAX_TENSORS`` tensors are planned, an
   exact search runs (``_branch_and_bound``): depth first over the plans in which every tensor sits at
   offset 0 or on top of a tensor it is live with (the "bottom-left" offsets; lowering each tensor of
   an optimal plan as far as it goes gives such a plan, so one of them is optimal), placed in offset
   order, so each plan is met once. Children go offset ascending, then in the best heuristic order;
   the heuristics' plan is the first incumbent. A branch is cut where the arena so far, or the
   tensors left to place stacked above the last offset beside what the placed ones hold there, reaches
   the incumbent. It stops at the bound or after ``SEARCH_NODES`` placements (deterministic, no
   clock) and keeps the best plan found, never worse than the heuristics'. On 12,728 random problems of
   6-16 tensors where the heuristics miss the bound, 10,000 placements found the arena that 1,000,000
   find on all but one (measured); zoo plans reach the bound before it and never run it.

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
RETRY_ABOVE_PERCENT = 105  # the project's target, arena <= 1.05x the bound: above it the other orders run
EXACT_MAX_TENSORS = 32  # the exact search runs on at most this many tensors (above 0 bytes): a node costs O(n^2)-O(n^3)
SEARCH_NODES = 10_000  # the exact search's hard budget, placements tried: at most ~5 ms compiled at 32 tensors


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


def assign_offsets(sizes, first, last, alignment=DEFAULT_ALIGNMENT, search_nodes=SEARCH_NODES):
    """Offsets (int64, multiples of ``alignment``) and the arena size in bytes: greedy by size's plan
    where it is at most ``RETRY_ABOVE_PERCENT`` percent of the lower bound, else the smallest arena of the
    ``STRATEGIES``, tried in order until one reaches the bound (the first on a tie); then, above the bound
    on at most ``EXACT_MAX_TENSORS`` tensors, the exact search's best within ``search_nodes`` placements."""
    offsets, arena, _ = plan_offsets(sizes, first, last, alignment, search_nodes)
    return offsets, arena


def plan_offsets(sizes, first, last, alignment=DEFAULT_ALIGNMENT, search_nodes=SEARCH_NODES):
    """``assign_offsets``' offsets and arena, and the ``live_lower_bound`` it judged them by (computed once)."""
    if isinstance(search_nodes, (bool, np.bool_)) or not isinstance(search_nodes, (int, np.integer)) \
            or search_nodes < 0:
        raise ValueError(f"search_nodes must be a non-negative integer (0 turns the exact search off), "
                         f"got {search_nodes!r}")
    aligned, first, last = check_problem(sizes, first, last, alignment)
    best_order = ORDERS[STRATEGIES[0]](aligned, first, last)
    best_offsets, best_arena = _place_in_order(aligned, first, last, best_order)
    bound = _peak_live(aligned, first, last)
    if 100 * best_arena > RETRY_ABOVE_PERCENT * bound:
        for strategy in STRATEGIES[1:]:
            if best_arena <= bound:
                break  # no placement beats the bound
            order = ORDERS[strategy](aligned, first, last)
            offsets, arena = _place_in_order(aligned, first, last, order)
            if arena < best_arena:
                best_offsets, best_arena, best_order = offsets, arena, order
    if best_arena > bound and search_nodes > 0 and np.count_nonzero(aligned) <= EXACT_MAX_TENSORS:
        budget = min(int(search_nodes), 2**62)  # an int64 in the compiled build
        best_offsets, best_arena = _search_exact(aligned, first, last, best_order, best_offsets, best_arena, bound,
                                                 budget)
    return best_offsets, best_arena, bound


def assign_offsets_by(strategy, sizes, first, last, alignment=DEFAULT_ALIGNMENT):
    """Offsets and arena size of one strategy alone (a name in ``STRATEGIES``)."""
    if strategy not in ORDERS:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    aligned, first, last = check_problem(sizes, first, last, alignment)
    return _place_in_order(aligned, first, last, ORDERS[strategy](aligned, first, last))


def _place_in_order(aligned, first, last, order):
    offsets = array("q", bytes(8 * len(aligned)))
    arena = _place(_int64s(aligned), _int64s(first), _int64s(last), _int64s(order), offsets)
    return np.array(offsets, dtype=np.int64), int(arena)


# The placement orders (step 2), each a total order (index ascending last: lexsort is stable).
def _by_size(aligned, first, last):
    """Size descending, first op ascending: greedy by size."""
    return np.lexsort((first, -aligned))


def _by_size_then_longest(aligned, first, last):
    """Size descending, lifetime length descending, first op ascending: long-lived tensors of a
    size take the low offsets and the short-lived ones pack around them."""
    return np.lexsort((first, first.astype(np.int64) - last, -aligned))


def _by_size_then_latest(aligned, first, last):
    """Size descending, last op descending: greedy by size walking time backwards. A chain of
    equal tensors is placed from its end, so its link live at a wide op near the end of the
    schedule (a workspace at the last backward op, as mobilenet_v3_small's had) is placed first and the chain packs around it."""
    return np.lexsort((-last.astype(np.int64), -aligned))


def _by_breadth(aligned, first, last):
    """Greedy by breadth (TFLite): the most live bytes at any op of the tensor's lifetime descending,
    then size descending, first op ascending; the tensors of the widest ops are placed first."""
    return np.lexsort((first, -aligned, -_widest_live(aligned, first, last)))


ORDERS = {"size": _by_size, "size_then_longest": _by_size_then_longest,
          "size_then_latest": _by_size_then_latest, "breadth": _by_breadth}
STRATEGIES = tuple(ORDERS)  # greedy by size first: its plan stands wherever it meets the target


def _widest_live(aligned, first, last):
    """For each tensor, the most aligned bytes live at any op of its lifetime. The live total only
    rises at a first op, so it is evaluated at the distinct first ops (``points``); each lifetime
    covers a run of them, whose maximum a sparse table answers (two overlapping power-of-two spans)."""
    points = np.unique(first)
    born = np.searchsorted(points, first)
    change = np.zeros(len(points) + 1, dtype=np.int64)
    np.add.at(change, born, aligned)
    np.add.at(change, np.searchsorted(points, last, side="right"), -aligned)
    levels = [np.cumsum(change[:len(points)])]  # levels[k][j]: the most live at points j .. j + 2**k - 1
    while 2 ** len(levels) <= len(points):  # no negative indices: the build turns wraparound off
        below, half = levels[len(levels) - 1], 2 ** (len(levels) - 1)
        levels.append(np.maximum(below[:len(below) - half], below[half:]))
    length = np.searchsorted(points, last, side="right") - born  # points in the lifetime, >= 1
    level = np.zeros(len(aligned), dtype=np.int64)
    for k in range(1, len(levels)):
        level += length >= 2 ** k
    widest = np.zeros(len(aligned), dtype=np.int64)
    for k, table in enumerate(levels):
        at = np.flatnonzero(level == k)
        widest[at] = np.maximum(table[born[at]], table[born[at] + length[at] - 2 ** k])
    return widest


def live_lower_bound(sizes, first, last, alignment=DEFAULT_ALIGNMENT):
    """Largest total of aligned sizes live at any one op; a bound no allocator can beat."""
    aligned, first, last = check_problem(sizes, first, last, alignment)
    return _peak_live(aligned, first, last)


def _peak_live(aligned, first, last):
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
            continue  # zero-size tensors stay at offset 0
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


# The exact search (step 5): branch and bound over "bottom-left" plans.
def _search_exact(aligned, first, last, order, offsets, arena, bound, budget):
    """The smallest arena found by ``_branch_and_bound`` within ``budget`` placements, starting from the
    heuristics' plan (``offsets``, ``arena``); the tensors branch in ``order``, the heuristic's."""
    ranked = order[aligned[order] > 0]
    size = aligned[ranked]
    f, l = first[ranked].astype(np.int64), last[ranked].astype(np.int64)
    points = np.unique(f)  # the live total only rises at a first op: its maximum over any span is at one of these
    overlap = (f[:, None] <= l[None, :]) & (f[None, :] <= l[:, None])
    best = _int64s(offsets[ranked])
    arena = _branch_and_bound(_int64s(size), _int64s(np.searchsorted(points, f)),
                              _int64s(np.searchsorted(points, l, side="right")), _int64s(overlap.ravel()),
                              len(points), bound, budget, arena, best)
    out = offsets.copy()
    out[ranked] = np.array(best, dtype=np.int64)
    return out, int(arena)


def _branch_and_bound(size, p0, p1, overlap, n_points, bound, budget, best_arena, best):
    """Depth-first over plans in which every tensor sits at offset 0 or on top of a tensor it is live
    with, placed in offset order (tensor order on a tie): some optimal plan is one of them (lower each
    tensor of an optimal plan as far as it goes). Tensor i lives at points ``[p0[i], p1[i])``, ``overlap``
    is the n x n live-together matrix. A branch is cut where its lower bound reaches ``best_arena``; the
    search stops at ``bound`` or after ``budget`` placements. Writes a better plan into ``best`` and
    returns its arena (``best_arena`` where none was found)."""
    n = len(size)
    slot = n * n  # children of one node: at most n offsets (0 and the ends of n - 1 tensors) x n tensors
    offset = array("q", bytes(8 * n))
    end = array("q", bytes(8 * n))
    remaining = array("q", bytes(8 * n_points))  # bytes of the tensors not yet placed, live at each point
    above = array("q", bytes(8 * n_points))
    child_tensor = array("q", bytes(8 * n * slot))
    child_offset = array("q", bytes(8 * n * slot))
    n_children = array("q", bytes(8 * n))
    cursor = array("q", bytes(8 * n))
    chosen = array("q", bytes(8 * n))  # the tensor placed at each depth
    floor = array("q", bytes(8 * n))  # the offset of the tensor placed last: the rest go at or above it
    height = array("q", bytes(8 * n))  # the arena of the tensors placed so far
    for i in range(n):
        offset[i] = -1
        for p in range(p0[i], p1[i]):
            remaining[p] += size[i]
    n_children[0] = _children(size, overlap, offset, end, 0, -1, child_tensor, child_offset, 0)
    nodes = 0
    depth = 0
    while depth >= 0:
        if cursor[depth] == n_children[depth]:
            depth -= 1
            if depth >= 0:
                _unplace(size, p0, p1, offset, remaining, chosen[depth])
            continue
        k = depth * slot + cursor[depth]
        cursor[depth] += 1
        nodes += 1
        if nodes > budget:
            break
        i = child_tensor[k]
        y = child_offset[k]
        top = y + size[i] if y + size[i] > height[depth] else height[depth]
        if top >= best_arena:
            continue
        offset[i] = y
        end[i] = y + size[i]
        for p in range(p0[i], p1[i]):
            remaining[p] -= size[i]
        if depth + 1 == n:
            best_arena = top
            for j in range(n):
                best[j] = offset[j]
            _unplace(size, p0, p1, offset, remaining, i)
            if best_arena <= bound:
                break
            continue
        if _plan_bound(p0, p1, overlap, offset, end, remaining, above, y, top) >= best_arena:
            _unplace(size, p0, p1, offset, remaining, i)
            continue
        chosen[depth] = i
        depth += 1
        floor[depth] = y
        height[depth] = top
        cursor[depth] = 0
        n_children[depth] = _children(size, overlap, offset, end, y, i, child_tensor, child_offset, depth * slot)
    return best_arena


def _children(size, overlap, offset, end, floor, last, child_tensor, child_offset, at):
    """Write the node's children from ``at``, offset ascending, then tensor: every unplaced tensor at every
    offset from ``floor`` up (0 or the end of a placed tensor) where it rests on a placed tensor it is live with
    and fits; at ``floor`` itself only tensors after ``last``. Returns how many."""
    n = len(size)
    count = 0
    y = 0
    if floor > 0:
        y = -1
        for j in range(n):
            if offset[j] >= 0 and end[j] >= floor and (y < 0 or end[j] < y):
                y = end[j]
    while y >= 0:
        for i in range(n):
            if offset[i] < 0 and (y > floor or i > last) and _rests_and_fits(size, overlap, offset, end, i, y):
                child_tensor[at + count] = i
                child_offset[at + count] = y
                count += 1
        following = -1
        for j in range(n):
            if offset[j] >= 0 and end[j] > y and (following < 0 or end[j] < following):
                following = end[j]
        y = following
    return count


def _rests_and_fits(size, overlap, offset, end, i, y):
    """Whether tensor i at offset ``y`` sits on 0 or on a placed tensor live with it, and overlaps none."""
    n = len(size)
    rests = y == 0
    for j in range(n):
        if offset[j] >= 0 and overlap[i * n + j]:
            if end[j] == y:
                rests = True
            elif offset[j] < y + size[i] and y < end[j]:
                return False
    return rests


def _plan_bound(p0, p1, overlap, offset, end, remaining, above, floor, top):
    """A lower bound on the arena of every plan below this node: at each point, the tensors not placed
    yet go above ``floor`` beside what placed tensors hold there; a tensor with nothing left to rest on
    (not at 0, and no tensor live with it unplaced or ending at or above ``floor``) makes it unbounded."""
    n = len(offset)
    for p in range(len(above)):
        above[p] = 0
    for j in range(n):
        if offset[j] >= 0 and end[j] > floor:
            for p in range(p0[j], p1[j]):
                above[p] += end[j] - floor
    lower = top
    for p in range(len(above)):
        if floor + above[p] + remaining[p] > lower:
            lower = floor + above[p] + remaining[p]
    if floor > 0:
        for i in range(n):
            if offset[i] < 0:
                stranded = True
                for j in range(n):
                    if j != i and overlap[i * n + j] and (offset[j] < 0 or end[j] >= floor):
                        stranded = False
                        break
                if stranded:
                    return MAX_ARENA_BYTES
    return lower


def _unplace(size, p0, p1, offset, remaining, i):
    offset[i] = -1
    for p in range(p0[i], p1[i]):
        remaining[p] += size[i]
