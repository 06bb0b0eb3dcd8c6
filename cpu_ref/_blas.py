"""One BLAS thread for the duration of a kernel call, safely across Python threads.

numba's ``np.dot`` calls SciPy's bundled OpenBLAS, whose thread count is one process-wide
setting (``openblas_set_num_threads``). The convolution wrappers run their GEMMs from the
numba thread pool and want a single-threaded BLAS (``cpu_ref._conv``'s header says why).
Pinning is reference-counted: the first thread to enter `one_blas_thread()` saves the count
and sets 1, the last one to leave restores it. While any thread is inside, the count is 1,
so every pinned GEMM of every thread runs single-threaded, and a thread's results never
depend on what another thread is doing; once all have left, the count is what it was before.
(threadpoolctl's ``threadpool_limits`` sets the same process-wide count without counting
users, so two threads would still restore each other's values; hence the counter here.)
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import threading


def _openblas_function(name):
    """``openblas_<name>`` of the OpenBLAS SciPy bundles (either symbol prefix), or ``None``."""
    try:
        import scipy
    except ImportError:
        return None
    libs = glob.glob(os.path.join(os.path.dirname(os.path.dirname(scipy.__file__)), "scipy.libs", "*openblas*"))
    for path in libs:
        lib = ctypes.CDLL(path)
        for prefix in ("scipy_openblas_", "openblas_"):
            fn = getattr(lib, prefix + name, None)
            if fn is not None:
                return fn
    return None


def _find_blas_thread_control():
    """``(get, set)`` for the thread count of the OpenBLAS SciPy bundles, or ``None``."""
    get, set_ = _openblas_function("get_num_threads"), _openblas_function("set_num_threads")
    if get is None or set_ is None:
        return None
    get.restype = ctypes.c_int
    set_.argtypes = [ctypes.c_int]
    return get, set_


def _find_blas_core():
    """The kernel set SciPy's OpenBLAS chose for this CPU, lower case (``"skylakex"``, ``"haswell"``,
    ``"zen"``; ``OPENBLAS_CORETYPE`` overrides its choice), or ``None`` where it cannot be read."""
    get = _openblas_function("get_corename")
    if get is None:
        return None
    get.restype = ctypes.c_char_p
    return get().decode("ascii", "replace").strip().lower()


BLAS_THREADS = _find_blas_thread_control()
BLAS_CORE = _find_blas_core()
_lock = threading.Lock()
_users = 0           # threads inside one_blas_thread() right now
_saved_count = None  # the count the first of them found


def blas_thread_count() -> int | None:
    """SciPy's OpenBLAS thread count now (None where it cannot be read)."""
    return None if BLAS_THREADS is None else BLAS_THREADS[0]()


@contextlib.contextmanager
def one_blas_thread():
    """Run the body with SciPy's OpenBLAS on one thread (see the module header)."""
    global _users, _saved_count
    get, set_ = BLAS_THREADS
    with _lock:
        if _users == 0:
            _saved_count = get()
            set_(1)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                set_(_saved_count)
