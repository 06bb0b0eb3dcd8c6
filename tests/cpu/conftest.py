"""Fixtures shared by the CPU kernel tests."""
import numba
import pytest

from cpu_ref import _misc


@pytest.fixture(params=["serial", "thread pool"])
def pool(request, monkeypatch):
    """Serially, or with every kernel on the thread pool (two threads where numba has them)."""
    if request.param == "thread pool":
        if numba.config.NUMBA_NUM_THREADS < 2:
            pytest.skip("numba's pool has one thread here (NUMBA_NUM_THREADS=1): nothing runs concurrently")
        monkeypatch.setattr(_misc, "PARALLEL_MIN_ELEMENTS", 0)
        previous = numba.get_num_threads()
        numba.set_num_threads(2)
        yield
        numba.set_num_threads(previous)
    else:
        yield
