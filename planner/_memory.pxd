# The C types of `_memory.py` when `setup.py` compiles it (Cython's augmenting .pxd); the .py
# itself stays plain Python, so the uncompiled module needs no Cython at run time.
cimport cython
from libc.stdint cimport int64_t

ctypedef int64_t[::1] Pool

cdef int64_t TIME_BUCKETS


@cython.locals(n=Py_ssize_t, planned=Py_ssize_t, k=Py_ssize_t, g=Py_ssize_t, i=Py_ssize_t, n_buckets=Py_ssize_t,
               everything=Py_ssize_t, pending=Py_ssize_t, t0=int64_t, t1=int64_t, span=int64_t, size=int64_t,
               f=int64_t, l=int64_t, g0=Py_ssize_t, g1=Py_ssize_t, offset=int64_t, arena=int64_t,
               start=Pool, count=Pool, live=Pool, shelf_offset=Pool, shelf_end=Pool, shelf_first=Pool, shelf_last=Pool)
cdef int64_t _place(const int64_t[::1] aligned, const int64_t[::1] first, const int64_t[::1] last,
                    const int64_t[::1] order, int64_t[::1] offsets) except -1

@cython.locals(n_live=Py_ssize_t, j=Py_ssize_t, k=Py_ssize_t, gap=int64_t, best_offset=int64_t, best_gap=int64_t,
               prev_end=int64_t)
cdef int64_t _best_fit(Pool offsets, Pool ends, Pool firsts, Pool lasts, Py_ssize_t start, Py_ssize_t count,
                       int64_t size, int64_t f, int64_t l, Pool live) noexcept

@cython.locals(stop=Py_ssize_t, at=Py_ssize_t)
cdef void _insert(Pool offsets, Pool ends, Pool firsts, Pool lasts, Py_ssize_t start, Py_ssize_t count,
                  int64_t offset, int64_t end, int64_t f, int64_t l) noexcept

@cython.locals(stop=Py_ssize_t, b=Py_ssize_t, offset=int64_t, at=Py_ssize_t)
cdef void _merge(Pool offsets, Pool ends, Pool firsts, Pool lasts, Py_ssize_t into, Py_ssize_t count,
                 Py_ssize_t source, Py_ssize_t n_source) noexcept

@cython.locals(mid=Py_ssize_t)
cdef Py_ssize_t _upper_bound(Pool offsets, Py_ssize_t lo, Py_ssize_t hi, int64_t offset) noexcept

@cython.locals(j=Py_ssize_t)
cdef void _shift(Pool values, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t by) noexcept

@cython.locals(n=Py_ssize_t, slot=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t, p=Py_ssize_t, k=Py_ssize_t, depth=Py_ssize_t,
               nodes=int64_t, y=int64_t, top=int64_t, offset=Pool, end=Pool, remaining=Pool, above=Pool,
               child_tensor=Pool, child_offset=Pool, n_children=Pool, cursor=Pool, chosen=Pool, floor=Pool, height=Pool)
cdef int64_t _branch_and_bound(const int64_t[::1] size, const int64_t[::1] p0, const int64_t[::1] p1,
                               const int64_t[::1] overlap, Py_ssize_t n_points, int64_t bound, int64_t budget,
                               int64_t best_arena, int64_t[::1] best) except -1

@cython.locals(n=Py_ssize_t, count=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t, y=int64_t, following=int64_t)
cdef Py_ssize_t _children(const int64_t[::1] size, const int64_t[::1] overlap, Pool offset, Pool end, int64_t floor,
                          Py_ssize_t last, Pool child_tensor, Pool child_offset, Py_ssize_t at) noexcept

@cython.locals(n=Py_ssize_t, j=Py_ssize_t, rests=cython.bint)
cdef cython.bint _rests_and_fits(const int64_t[::1] size, const int64_t[::1] overlap, Pool offset, Pool end,
                                 Py_ssize_t i, int64_t y) noexcept

@cython.locals(n=Py_ssize_t, p=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t, lower=int64_t, stranded=cython.bint)
cdef int64_t _plan_bound(const int64_t[::1] p0, const int64_t[::1] p1, const int64_t[::1] overlap, Pool offset,
                         Pool end, Pool remaining, Pool above, int64_t floor, int64_t top) noexcept

@cython.locals(p=Py_ssize_t)
cdef void _unplace(const int64_t[::1] size, const int64_t[::1] p0, const int64_t[::1] p1, Pool offset,
                   Pool remaining, Py_ssize_t i) noexcept
