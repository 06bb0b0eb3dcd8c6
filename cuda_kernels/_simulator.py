"""One correction to numba-cuda's CUDA simulator, installed when the simulator is on.

The simulator runs one Python thread per CUDA thread. Its shared-memory allocator
(``FakeCUDAShared.array``, numba-cuda 0.30.4 and earlier) looks up the array of a source line
and, when there is none yet, creates one and stores it: a check-then-set that two threads of a
block can both pass when the interpreter switches threads between the look-up and the store
(on a busy machine, or with a short ``sys.setswitchinterval``). Those two threads then hold two
different "shared" arrays for the rest of the block: a block reduction reads slots nobody wrote,
a ``cp.async`` stage lands where no warp reads it. A GPU has no such failure; in the simulator it
made a step's results move between runs only when the machine was loaded (seen as a pipelined
training step ending with other weights, and as ``math domain error`` in the loss kernel).

``install()`` replaces the allocator with one whose create-and-store is a single atomic
``dict.setdefault``, so every thread of a block gets the array that was stored first. It also
finds the calling line from the caller's frame instead of formatting the whole stack
(``traceback.extract_stack``), which is what the original keys on.
"""
import sys

import numpy as np

_INSTALLED_MARK = "_blueprint_atomic_allocation"
replaced_allocator = None   # numba-cuda's own ``FakeCUDAShared.array``, once ``install()`` replaced it


def _shared_array(self, shape, dtype, alignment=None):
    """``cuda.shared.array`` of the simulator: one array per (source file, line) and launch, atomically."""
    from numba.core import types
    from numba.np import numpy_support
    if alignment is not None:
        raise RuntimeError("Array alignment is not supported in cudasim")
    if isinstance(dtype, types.Type):
        dtype = numpy_support.as_dtype(dtype)
    if shape == 0:   # dynamic shared memory: one buffer for the launch
        count = self._dynshared_size // dtype.itemsize
        return np.frombuffer(self._dynshared.data, dtype=dtype, count=count)
    frame = sys._getframe(1)
    caller = (frame.f_code.co_filename, frame.f_lineno)
    found = self._allocations.get(caller)
    if found is None:
        found = self._allocations.setdefault(caller, np.empty(shape, dtype))
    return found


def install():
    """Make the simulator's shared-array allocation atomic (idempotent). Raises where the simulator's
    allocator is not the one this corrects (a numba-cuda whose internals changed): the tests must not
    run on an allocator nobody has checked."""
    from numba.cuda.simulator import kernelapi
    shared = kernelapi.FakeCUDAShared
    if getattr(shared.array, _INSTALLED_MARK, False):
        return
    probe = shared(16)
    if not (isinstance(getattr(probe, "_allocations", None), dict) and hasattr(probe, "_dynshared")
            and getattr(probe, "_dynshared_size", None) == 16):
        raise RuntimeError("cuda_kernels._simulator: numba-cuda's simulator no longer keeps shared arrays in "
                           "FakeCUDAShared._allocations; re-check its allocator for the check-then-set race "
                           "this module corrects, then update install()")
    global replaced_allocator
    replaced_allocator = shared.array
    setattr(_shared_array, _INSTALLED_MARK, True)
    shared.array = _shared_array
