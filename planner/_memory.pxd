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
