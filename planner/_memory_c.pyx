# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Static offset allocator for transient tensors — the Cython implementation.

Same algorithm as ``planner._memory_py`` (its header states it in full; the tests
assert bit-identical results): greedy by size, best fit. Tensors are placed in
(aligned size desc, first asc, index asc) order; each goes into the smallest gap,
lowest offset on a tie, left between the already-placed tensors whose lifetimes
intersect its own, or above the highest of them. Zero-size tensors are never
planned: offset 0, they occupy nothing.

How it is fast (only validation and result boxing touch Python objects):

- A *shelf* is a list of placed tensors kept sorted by offset in C arrays, so the
  tensors that conflict with a new one come out of one linear scan already in
  offset order: no per-tensor sort. An exact fit ends the scan early.
- The scan first computes a byte mask "lifetime intersects" over the whole shelf
  (a branch-free loop the compiler vectorises), then walks only the set bytes.
- The schedule is cut into ``TIME_BUCKETS`` equal spans with one shelf each,
  holding every placed tensor that touches the span, besides the shelf of all
  placed tensors. A tensor whose lifetime fits in one span searches only that
  span's shelf, which holds every tensor it can conflict with; one that crosses a
  span boundary searches the shelf of all. Short-lived tensors, the bulk of a
  training step's transients, so scan a small fraction of the placed tensors.
- The shelf of all is only searched by those crossing tensors, so new tensors
  wait in a pending list and are merged in (one pass) just before such a search.
"""
from libc.stdint cimport INT64_MAX, int32_t, int64_t, uint8_t, uint64_t
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdlib cimport qsort
from libc.string cimport memmove

import numpy as np

from planner._memory_py import DEFAULT_ALIGNMENT, check_problem

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    /* Bit k of the result is byte k of the 64 mask bytes at p (each 0 or 1). */
    static inline uint64_t blueprint_mask_bits(const uint8_t* p) {
        uint64_t bits = 0, word;
        for (int q = 0; q < 8; q++) {
            memcpy(&word, p + 8 * q, sizeof word);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
            word = __builtin_bswap64(word);
    #endif
            /* 0x0102040810204080 moves byte k's low bit to bit 56 + k without carries. */
            bits |= ((word * 0x0102040810204080ULL) >> 56) << (8 * q);
        }
        return bits;
    }
    #if defined(_MSC_VER)
    #include <intrin.h>
    static inline int blueprint_lowest_bit(uint64_t x) { unsigned long i; _BitScanForward64(&i, x); return (int)i; }
    #else
    static inline int blueprint_lowest_bit(uint64_t x) { return __builtin_ctzll(x); }
    #endif
    """
    uint64_t blueprint_mask_bits(const uint8_t* p) nogil
    int blueprint_lowest_bit(uint64_t x) nogil

cdef enum:
    TIME_BUCKETS = 32  # more spans scan less but copy long-lived tensors into more shelves


cdef struct Shelf:
    int64_t* offset
    int64_t* end
    int32_t* first
    int32_t* last
    Py_ssize_t count


cdef struct Placed:
    int64_t offset
    int64_t end
    int32_t first
    int32_t last


cdef struct OrderKey:
    int64_t size
    int32_t first
    int32_t index


cdef struct Event:
    int64_t key    # op * 2 + (0 free, 1 allocate): frees at an op sort before allocations
    int64_t delta


cdef int _placement_before(const void* a, const void* b) noexcept nogil:
    cdef const OrderKey* x = <const OrderKey*> a
    cdef const OrderKey* y = <const OrderKey*> b
    if x.size != y.size:
        return -1 if x.size > y.size else 1
    if x.first != y.first:
        return -1 if x.first < y.first else 1
    return -1 if x.index < y.index else (1 if x.index > y.index else 0)


cdef int _offset_before(const void* a, const void* b) noexcept nogil:
    cdef int64_t x = (<const Placed*> a).offset
    cdef int64_t y = (<const Placed*> b).offset
    return -1 if x < y else (1 if x > y else 0)


cdef int _event_before(const void* a, const void* b) noexcept nogil:
    cdef int64_t x = (<const Event*> a).key
    cdef int64_t y = (<const Event*> b).key
    return -1 if x < y else (1 if x > y else 0)


cdef int64_t _best_fit(const Shelf* shelf, int64_t size, int32_t f, int32_t l, uint8_t* hit) noexcept nogil:
    """Offset of the smallest gap that fits ``size`` among the shelf's tensors live in [f, l]."""
    cdef Py_ssize_t j, w, n = shelf.count
    cdef int64_t gap, best_offset = -1, best_gap = INT64_MAX, prev_end = 0
    cdef uint64_t bits
    # Local pointers, not shelf fields: byte stores may alias the struct, which would stop vectorisation.
    cdef const int32_t* firsts = shelf.first
    cdef const int32_t* lasts = shelf.last
    cdef const int64_t* starts = shelf.offset
    cdef const int64_t* ends = shelf.end
    for j in range(n):
        hit[j] = (firsts[j] <= l) & (lasts[j] >= f)
    for j in range(n, (n + 63) & ~63):
        hit[j] = 0
    for w in range(0, n, 64):
        bits = blueprint_mask_bits(&hit[w])
        while bits != 0:
            j = w + blueprint_lowest_bit(bits)
            bits &= bits - 1
            gap = starts[j] - prev_end
            if gap >= size and gap < best_gap:
                best_offset = prev_end
                best_gap = gap
                if gap == size:
                    return best_offset  # exact fit at the lowest such offset: nothing later beats it
            prev_end = max(prev_end, ends[j])
    return prev_end if best_offset < 0 else best_offset


cdef void _insert(Shelf* shelf, int64_t offset, int64_t end, int32_t f, int32_t l) noexcept nogil:
    cdef Py_ssize_t lo = 0, hi = shelf.count, mid, tail
    while lo < hi:  # after every tensor at a lower or equal offset
        mid = (lo + hi) >> 1
        if shelf.offset[mid] <= offset:
            lo = mid + 1
        else:
            hi = mid
    tail = shelf.count - lo
    memmove(&shelf.offset[lo + 1], &shelf.offset[lo], tail * sizeof(int64_t))
    memmove(&shelf.end[lo + 1], &shelf.end[lo], tail * sizeof(int64_t))
    memmove(&shelf.first[lo + 1], &shelf.first[lo], tail * sizeof(int32_t))
    memmove(&shelf.last[lo + 1], &shelf.last[lo], tail * sizeof(int32_t))
    shelf.offset[lo] = offset
    shelf.end[lo] = end
    shelf.first[lo] = f
    shelf.last[lo] = l
    shelf.count += 1


cdef void _settle(Shelf* shelf, Placed* pending, Py_ssize_t n_pending) noexcept nogil:
    """Merge the pending tensors into the shelf, keeping it sorted by offset."""
    cdef Py_ssize_t p, lo, hi, mid, tail, end = shelf.count  # shelf[end:] is already in its final place
    qsort(pending, n_pending, sizeof(Placed), _offset_before)
    for p in range(n_pending - 1, -1, -1):  # from the back, so every shelf entry moves at most once
        lo = 0
        hi = end
        while lo < hi:
            mid = (lo + hi) >> 1
            if shelf.offset[mid] <= pending[p].offset:
                lo = mid + 1
            else:
                hi = mid
        tail = end - lo
        memmove(&shelf.offset[lo + p + 1], &shelf.offset[lo], tail * sizeof(int64_t))
        memmove(&shelf.end[lo + p + 1], &shelf.end[lo], tail * sizeof(int64_t))
        memmove(&shelf.first[lo + p + 1], &shelf.first[lo], tail * sizeof(int32_t))
        memmove(&shelf.last[lo + p + 1], &shelf.last[lo], tail * sizeof(int32_t))
        shelf.offset[lo + p] = pending[p].offset
        shelf.end[lo + p] = pending[p].end
        shelf.first[lo + p] = pending[p].first
        shelf.last[lo + p] = pending[p].last
        end = lo
    shelf.count += n_pending


cdef int64_t _place(const int64_t[::1] aligned, const int32_t[::1] first, const int32_t[::1] last,
                    OrderKey* order, Shelf* shelves, Py_ssize_t n_buckets, int64_t t0, int64_t span,
                    Placed* pending, uint8_t* hit, int64_t[::1] offsets) noexcept nogil:
    """Greedy by size, best fit; ``shelves[n_buckets]`` is the shelf of all placed tensors."""
    cdef Py_ssize_t n = aligned.shape[0], k, g, g0, g1, n_pending = 0
    cdef int64_t size, offset, arena = 0
    cdef int32_t f, l, i
    cdef Shelf* everything = &shelves[n_buckets]
    for k in range(n):
        order[k].size = aligned[k]
        order[k].first = first[k]
        order[k].index = <int32_t> k
    qsort(order, n, sizeof(OrderKey), _placement_before)
    for k in range(n):
        i = order[k].index
        size = order[k].size
        if size == 0:
            break  # sizes descend, so only zero-size tensors remain; they stay at offset 0
        f = first[i]
        l = last[i]
        g0 = (f - t0) // span
        g1 = (l - t0) // span
        if g0 == g1:
            offset = _best_fit(&shelves[g0], size, f, l, hit)
        else:
            _settle(everything, pending, n_pending)
            n_pending = 0
            offset = _best_fit(everything, size, f, l, hit)
        offsets[i] = offset
        arena = max(arena, offset + size)
        pending[n_pending] = Placed(offset, offset + size, f, l)
        n_pending += 1
        for g in range(g0, g1 + 1):
            _insert(&shelves[g], offset, offset + size, f, l)
    return arena


def assign_offsets(sizes, first, last, alignment=DEFAULT_ALIGNMENT):
    """Offsets (int64, multiples of ``alignment``) and the arena size in bytes."""
    aligned, first, last = check_problem(sizes, first, last, alignment)
    cdef Py_ssize_t n = aligned.shape[0], g
    if n >= 2**31:
        raise ValueError(f"at most {2**31 - 1} tensors are supported, got {n}")
    offsets = np.zeros(n, dtype=np.int64)
    planned = aligned > 0
    t0 = int(first[planned].min()) if planned.any() else 0
    t1 = int(last[planned].max()) if planned.any() else 0
    span = -(-(t1 - t0 + 1) // TIME_BUCKETS)
    n_buckets = (t1 - t0) // span + 1
    # Shelf capacities: every planned tensor once in the shelf of all, once per span it touches.
    g0 = (first[planned].astype(np.int64) - t0) // span
    g1 = (last[planned].astype(np.int64) - t0) // span
    capacity = np.cumsum(np.bincount(g0, minlength=n_buckets + 1) - np.bincount(g1 + 1, minlength=n_buckets + 1))
    capacity[n_buckets] = len(g0)
    starts = np.concatenate(([0], np.cumsum(capacity)))
    pool_size = int(starts[n_buckets + 1]) + 1
    # Scratch as NumPy buffers, so they are freed however this call ends.
    cdef int64_t[::1] pool_offset = np.empty(pool_size, dtype=np.int64)
    cdef int64_t[::1] pool_end = np.empty(pool_size, dtype=np.int64)
    cdef int32_t[::1] pool_first = np.empty(pool_size, dtype=np.int32)
    cdef int32_t[::1] pool_last = np.empty(pool_size, dtype=np.int32)
    cdef uint8_t[::1] hit = np.empty(n + 64, dtype=np.uint8)
    cdef Placed[::1] pending = np.empty(n + 1, dtype=[("offset", np.int64), ("end", np.int64), ("first", np.int32),
                                                      ("last", np.int32)])
    cdef OrderKey[::1] order = np.empty(n + 1, dtype=[("size", np.int64), ("first", np.int32), ("index", np.int32)])
    cdef const int64_t[::1] aligned_view = aligned
    cdef const int32_t[::1] first_view = first
    cdef const int32_t[::1] last_view = last
    cdef int64_t[::1] offsets_view = offsets
    cdef Py_ssize_t start, buckets = n_buckets
    cdef int64_t arena, start_op = t0, bucket_ops = span
    cdef Shelf* shelves = <Shelf*> PyMem_Malloc((buckets + 1) * sizeof(Shelf))
    if shelves == NULL:
        raise MemoryError()
    try:
        for g in range(buckets + 1):
            start = starts[g]
            shelves[g] = Shelf(&pool_offset[start], &pool_end[start], &pool_first[start], &pool_last[start], 0)
        with nogil:
            arena = _place(aligned_view, first_view, last_view, &order[0], shelves, buckets, start_op, bucket_ops,
                           &pending[0], &hit[0], offsets_view)
    finally:
        PyMem_Free(shelves)
    return offsets, int(arena)


def live_lower_bound(sizes, first, last, alignment=DEFAULT_ALIGNMENT):
    """Largest total of aligned sizes live at any one op; a bound no allocator can beat."""
    aligned, first, last = check_problem(sizes, first, last, alignment)
    cdef Py_ssize_t n = aligned.shape[0], k
    cdef Event[::1] events = np.empty(2 * n + 1, dtype=[("key", np.int64), ("delta", np.int64)])
    cdef const int64_t[::1] aligned_view = aligned
    cdef const int32_t[::1] first_view = first
    cdef const int32_t[::1] last_view = last
    cdef int64_t live = 0, peak = 0
    with nogil:
        for k in range(n):
            events[2 * k].key = <int64_t> first_view[k] * 2 + 1
            events[2 * k].delta = aligned_view[k]
            events[2 * k + 1].key = (<int64_t> last_view[k] + 1) * 2
            events[2 * k + 1].delta = -aligned_view[k]
        # Order within one key cannot change the peak: all its deltas share a sign.
        qsort(&events[0], 2 * n, sizeof(Event), _event_before)
        for k in range(2 * n):
            live += events[k].delta
            peak = max(peak, live)
    return int(peak)
