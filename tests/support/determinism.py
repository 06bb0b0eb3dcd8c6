"""Determinism under contention for the simulator tier: every launch run twice from the same inputs.

The simulator runs one Python thread per CUDA thread, so a kernel that reads before the write it
depends on (a missing barrier, a scratch buffer reused too early) gives a result that depends on
how the interpreter interleaves its threads. An idle machine hides that: each thread runs for its
whole switch interval (5 ms), usually to the next barrier. ``contention()`` forces interleavings: a
switch interval of 10 us, so that every simulated thread (all of a block's are runnable between
barriers) is preempted at arbitrary points, as a loaded machine does now and then. That costs ~15%
more CPU; a busy thread taking the interpreter at each switch would cost 4x and was not needed to
surface the shared-array race that made a pipelined step move (``cuda_kernels/_simulator.py``).

``run_twice(entries)`` runs each kernel launch of ``entries`` once as it is, restores every array
argument, runs it again under contention and compares: bit-identical, except the arrays into which
the launch added floats atomically (the simulator's ``atomic.add``, recorded while it runs): their
order of addition is free on a GPU as well, so they are compared at float32 summation tolerance.
"""
import sys
from contextlib import contextmanager

import numpy as np
from numba.cuda.simulator import kernelapi

ATOMIC_RTOL, ATOMIC_ATOL_FRACTION = 1e-5, 1e-6   # fp32 sums in another order (tests/support/cuda_checks "fp32")
SWITCH_INTERVAL = 1e-5


@contextmanager
def contention(switch_interval=SWITCH_INTERVAL):
    """Forced thread switches every ``switch_interval`` seconds in this process while the block runs."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@contextmanager
def float_atomic_targets():
    """The host arrays (of simulator device arrays) that ``cuda.atomic.add`` / ``sub`` added floats into."""
    targets, originals = [], {}
    for name in ("add", "sub"):
        original = originals[name] = getattr(kernelapi.FakeCUDAAtomic, name)

        def recording(self, array, index, val, _original=original):
            item = getattr(array, "_item", None)   # a kernel argument (not a shared array)
            if item is not None and np.dtype(item.dtype).kind == "f":
                targets.append(item._ary)
            return _original(self, array, index, val)
        setattr(kernelapi.FakeCUDAAtomic, name, recording)
    try:
        yield targets
    finally:
        for name, original in originals.items():
            setattr(kernelapi.FakeCUDAAtomic, name, original)


def _device_arrays(args):
    return [a for a in args if hasattr(a, "copy_to_host")]


def _reordered(array, targets):
    host = array._ary
    return any(np.shares_memory(host, t) for t in targets)


def check_launch(entry, stream=0):
    """Run the kernel launch ``entry`` twice from the same inputs (the second time under contention) and
    compare every array argument; leaves the arguments as the first run left them."""
    arrays = _device_arrays(entry.args)
    before = [a.copy_to_host() for a in arrays]
    with float_atomic_targets() as targets:
        entry.run(stream)
    first = [a.copy_to_host() for a in arrays]
    for a, saved in zip(arrays, before):
        a.copy_to_device(saved)
    with contention():
        entry.run(stream)
    second = [a.copy_to_host() for a in arrays]
    for position, (a, x, y) in enumerate(zip(arrays, first, second)):
        label = f"{entry.name}: array argument {position} ({x.dtype}, {x.shape})"
        if _reordered(a, targets):
            atol = ATOMIC_ATOL_FRACTION * float(np.abs(x.astype(np.float64)).max(initial=0.0))
            np.testing.assert_allclose(y, x, rtol=ATOMIC_RTOL, atol=atol,
                                       err_msg=f"{label}: fp32 atomics beyond reordering")
        elif not np.array_equal(x.view(np.uint8), y.view(np.uint8)):
            where = np.flatnonzero(x.reshape(-1).view(np.uint8) != y.reshape(-1).view(np.uint8))
            raise AssertionError(f"{label}: the same launch from the same inputs wrote different bytes under "
                                 f"contention ({where.size} bytes differ, first at byte {where[0]})")
    for a, saved in zip(arrays, first):
        a.copy_to_device(saved)
    return entry.name


class FirstLaunchChecker:
    """``check_launch`` for the first launch of each kernel name, plain runs for the rest: a kernel test
    table's launcher (``replay``) passes its tape through this, so every kernel the table launches is checked
    once, at the cost of one more run under contention."""

    def __init__(self):
        self.checked = set()

    def replay(self, tape, stream=0):
        """Run ``tape`` (its kernels compiled) in order."""
        for entry in tape:
            if entry.kind == "kernel" and entry.name not in self.checked:
                self.checked.add(check_launch(entry, stream))
            else:
                entry.run(stream)


def run_twice(entries, stream=0):
    """``check_launch`` every kernel of ``entries`` (a tape's, in order); other entries (transfers,
    events) run once. Returns the kernel names checked, in launch order."""
    checked = []
    for entry in entries:
        if entry.kind == "kernel":
            checked.append(check_launch(entry, stream))
        else:
            entry.run(stream)
    return checked
