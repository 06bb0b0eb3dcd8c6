"""A block barrier for numba-cuda's CUDA simulator without its busy-polling manager thread.

The simulator runs one Python thread per CUDA thread. Its ``BlockManager.run`` (numba-cuda 0.30) starts a
block's threads and then polls them in a loop that never sleeps: each pass walks every thread (is it
blocked in ``syncthreads``? did it raise?) and rebuilds the set of live ones, and when all live threads are
blocked it releases them. That loop holds the interpreter for a share of every switch interval while the
simulated threads have work to do, and a 256-thread block's barrier waits for a full pass after its last
thread arrives.

``install()`` replaces the two with the same semantics, counted instead of polled: a thread reaching
``syncthreads`` increments the block's count of blocked threads under one lock; the thread that makes it
equal to the number of live threads (a thread that returned no longer counts, as in the original and on a
GPU) opens the barrier for all of them. A thread that raises aborts the block: every thread waiting or
arriving at a barrier raises "abort flag set", and the launch raises the first exception, with its thread and
block in the message, as the original does. Thread interleavings are untouched: which simulated thread runs
when is still the interpreter's choice (``tests/support/determinism.py`` forces switches), so a kernel that
races still gives different results; ``tests/cuda/test_simulator_barrier.py`` checks both.
"""
import threading

_INSTALLED_MARK = "_blueprint_counted_barrier"


class _Block:
    """The barrier state of one block: live and blocked thread counts, a generation per opening."""

    def __init__(self, threads):
        self.lock = threading.Condition(threading.Lock())
        self.live = threads
        self.blocked = 0
        self.generation = 0
        self.aborted = False

    def _open_if_all_blocked(self):
        if self.blocked and self.blocked == self.live:
            self.blocked = 0
            self.generation += 1
            self.lock.notify_all()

    def wait(self):
        with self.lock:
            if self.aborted:
                raise RuntimeError("abort flag set on syncthreads call")
            generation = self.generation
            self.blocked += 1
            self._open_if_all_blocked()
            while self.generation == generation and not self.aborted:
                self.lock.wait()
            if self.aborted:
                raise RuntimeError("abort flag set on syncthreads clear")

    def exited(self, failed):
        with self.lock:
            self.live -= 1
            if failed or not self.live:
                self.aborted = self.aborted or failed
                self.lock.notify_all()   # the waiting threads abort; the launch returns or raises
            else:
                self._open_if_all_blocked()

    def finished(self):
        """Wait until every thread has returned or one has raised; True if one raised."""
        with self.lock:
            while self.live and not self.aborted:
                self.lock.wait()
            return self.aborted


def install():
    """Replace ``BlockThread.syncthreads`` / ``run`` and ``BlockManager.run`` (idempotent). Raises when
    numba-cuda's simulator no longer has the pieces this replaces."""
    import numpy as np
    from numba.cuda.simulator import kernel

    thread, manager = kernel.BlockThread, kernel.BlockManager
    if getattr(manager.run, _INSTALLED_MARK, False):
        return
    if not all(hasattr(thread, name) for name in ("syncthreads", "syncthreads_count", "run")) or \
            not hasattr(manager, "run"):
        raise RuntimeError("tests/support/block_barrier: numba-cuda's simulator changed (BlockThread / BlockManager); "
                           "re-check it before replacing its barrier")
    original_thread_run = thread.run

    def syncthreads(self):
        self._block.wait()

    def thread_run(self):
        try:
            original_thread_run(self)   # catches the kernel's exception into self.exception
        finally:
            self._block.exited(self.exception is not None)

    def run(self, grid_point, *args):
        block = _Block(int(np.prod(self._block_dim)))
        threads = []
        for block_point in np.ndindex(*self._block_dim):
            def target():
                self._f(*args)
            t = kernel.BlockThread(target, self, grid_point, block_point, self._debug)
            t._block = block
            threads.append(t)
        for t in threads:
            t.start()
        if not block.finished():
            for t in threads:
                t.join()
            return
        # as the original, raise at once (threads waiting at a warp's threading.Barrier for a lane that raised are
        # daemons, left to time out), the error of a thread that failed, not of one the abort stopped
        failed = [t for t in threads if t.exception]
        t = next((t for t in failed if "abort flag set on syncthreads" not in str(t.exception[0])), failed[0])
        raise t.exception[0].with_traceback(t.exception[1])

    syncthreads.__doc__ = "The block barrier, counted (tests/support/block_barrier.py)."
    thread.syncthreads = syncthreads
    thread.run = thread_run
    setattr(run, _INSTALLED_MARK, True)
    manager.run = run
