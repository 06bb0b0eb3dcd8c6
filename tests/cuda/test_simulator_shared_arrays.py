"""The simulator's shared arrays: one per source line and launch for every thread of a block, also when
the interpreter switches threads in the middle of the allocation (``cuda_kernels/_simulator.py``).

The switch is forced, not waited for: ``np.empty`` is replaced by one that sleeps first, which hands the
interpreter to the block's other threads while the first one is between its look-up and its store.
"""
import time

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
    """numpy, but ``empty`` sleeps first (every other thread of the block reaches the allocation meanwhile)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(*args, **kwargs):
        time.sleep(0.01)
        return np.empty(*args, **kwargs)


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
    assert _sum_with_yielding_allocation(monkeypatch, kernelapi) != THREADS * (THREADS + 1) / 2
