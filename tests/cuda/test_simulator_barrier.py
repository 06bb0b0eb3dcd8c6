"""The simulator's block barrier as ``tests/support/block_barrier.py`` counts it (installed by conftest.py for
this tier): ``syncthreads`` holds every thread until all live threads of the block arrive, threads that
returned no longer count, and a thread that raises fails the launch with its own error. That a missing
barrier still shows (the warps of a block run apart): test_barrier_mutation.py, with this barrier."""
import threading

import numpy as np
import pytest
from numba import cuda
from numba.cuda.simulator import kernel

from tests.cuda.conftest import SIMULATOR
from tests.support import block_barrier

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's barrier (on a GPU the hardware's)")

THREADS = 64   # two warps
ROUNDS = 4


@cuda.jit
def _rotate_through_shared(x, out):
    """Each round every thread writes its value, then reads its neighbour's: only right with both barriers."""
    s = cuda.shared.array(THREADS, np.float32)
    t = cuda.threadIdx.x
    v = x[t]
    for _ in range(ROUNDS):
        s[t] = v
        cuda.syncthreads()
        v = s[(t + 1) % THREADS]
        cuda.syncthreads()
    out[t] = v


@cuda.jit
def _half_return_early(out):
    """The upper half returns before the barriers; the lower half still meets at them."""
    s = cuda.shared.array(THREADS, np.float32)
    t = cuda.threadIdx.x
    if t >= THREADS // 2:
        return
    s[t] = t
    cuda.syncthreads()
    out[t] = s[THREADS // 2 - 1 - t]
    cuda.syncthreads()


@cuda.jit
def _one_thread_raises(out):
    t = cuda.threadIdx.x
    cuda.syncthreads()
    out[t + (100 if t == 5 else 0)] = 1.0   # thread 5 indexes past the end
    cuda.syncthreads()


def _launch(launch, timeout=120):
    """``launch()`` in a thread: a barrier that never opens (or a launch that never returns) fails, not hangs."""
    raised = []

    def run():
        try:
            launch()
        except BaseException as e:   # handed to the test's thread
            raised.append(e)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the launch did not return in {timeout} s: a barrier waits for threads that left"
    if raised:
        raise raised[0]


def test_the_counted_barrier_is_installed():
    assert getattr(kernel.BlockManager.run, block_barrier._INSTALLED_MARK, False)
    assert kernel.BlockThread.syncthreads.__doc__.startswith("The block barrier, counted")


def test_every_round_reads_what_the_neighbour_wrote_in_that_round():
    x = np.arange(THREADS, dtype=np.float32)
    out = np.full(THREADS, np.nan, np.float32)
    _launch(lambda: _rotate_through_shared[2, THREADS](x, out))   # two blocks: the barrier state is per block
    np.testing.assert_array_equal(out, np.roll(x, -ROUNDS))


def test_threads_that_returned_do_not_hold_the_barrier():
    out = np.full(THREADS, np.nan, np.float32)
    _launch(lambda: _half_return_early[1, THREADS](out))
    half = THREADS // 2
    np.testing.assert_array_equal(out[:half], np.arange(half)[::-1])
    assert np.isnan(out[half:]).all()


def test_a_thread_that_raises_fails_the_launch_with_its_own_error():
    out = np.zeros(THREADS, np.float32)
    with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\] ctaid=\[0, 0, 0\]"):
        _launch(lambda: _one_thread_raises[1, THREADS](out))
