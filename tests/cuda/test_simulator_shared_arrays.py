"""The simulator's shared arrays: one per source line and launch for every thread of a block, also when
the interpreter switches threads in the middle of the allocation (``cuda_kernels/_simulator.py``).

The switch is forced, not waited for: ``np.empty`` is replaced by one that waits at a barrier of every
thread of the block. The first thread to allocate is then held between its look-up and its store, so
every other thread's look-up finds nothing and allocates too: with a check-then-set allocator every
thread ends with its own array, whatever the machine's speed or load (no sleep decides the outcome).
The arrays start as NaN, so a sum over slots another thread's array received is NaN, never the total.
"""
import threading

import numpy as np
from numba import cuda
from numba.cuda.simulator import kernelapi

from cuda_kernels import _simulator

THREADS = 32


@cuda.jit
def _block_sum(out):
    s = cuda.shared.array(THREADS, np.float32)
    t = cuda.threadIdx.x
    s[t] = t + 1
    cuda.syncthreads()
    if t == 0:
        total = np.float32(0)
        for i in range(THREADS):
            total += s[i]
        out[0] = total


class _YieldingNumpy:
    """numpy, but ``empty`` returns only when every thread of the block has called it, and fills with NaN."""

    def __init__(self):
        self._all_threads = threading.Barrier(THREADS, timeout=600)   # the timeout only guards against a hang

    def __getattr__(self, name):
        return getattr(np, name)

    def empty(self, shape, dtype):
        self._all_threads.wait()
        return np.full(shape, np.nan, dtype)


def _sum_with_yielding_allocation(monkeypatch, module):
    monkeypatch.setattr(module, "np", _YieldingNumpy())
    out = np.zeros(1, np.float32)
    _block_sum[1, THREADS](out)
    return out[0]


def test_every_thread_of_a_block_gets_the_same_shared_array_when_the_allocation_yields(monkeypatch):
    assert kernelapi.FakeCUDAShared.array is _simulator._shared_array, "cuda_kernels installs it with the simulator"
    assert _sum_with_yielding_allocation(monkeypatch, _simulator) == THREADS * (THREADS + 1) / 2


def test_numba_cudas_own_allocator_loses_the_writes_when_it_yields(monkeypatch):
    """The race ``_simulator`` corrects, shown on numba-cuda's allocator. If this starts to pass unchanged, a
    numba-cuda release has fixed the allocator: ``_simulator`` can then go."""
    monkeypatch.setattr(kernelapi.FakeCUDAShared, "array", _simulator.replaced_allocator)
    total = _sum_with_yielding_allocation(monkeypatch, kernelapi)
    assert np.isnan(total), f"thread 0 summed {total}: every thread was expected to hold its own array"
