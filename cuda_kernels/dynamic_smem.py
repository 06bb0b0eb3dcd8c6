"""Dynamic shared memory above 48 KB: each kernel's limit, raised once before its first launch.

A block may declare at most 48 KB of static shared memory. A tile whose pipeline needs more takes
it as dynamic shared memory (``cuda.shared.array(0, ...)``, its byte count the launch's fourth
configuration item, ``KernelSpec.dynamic_shared_bytes``), which the driver grants only up to the
kernel's ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``: 48 KB until raised, at most the
architecture's opt-in maximum per block (``MAX_SHARED_PER_BLOCK``). numba-cuda 0.30 exposes only
the carveout, so ``raise_shared_limit`` sets the attribute through ``cuda.bindings.driver`` on the
handle numba loaded, as numba-cuda sets the carveout: a ``CUkernel`` (numba-cuda 0.30 loads
kernels through cuda.core libraries: ``cuKernelSetAttribute`` for the device) or a ``CUfunction``
(``cuFuncSetAttribute``). ``tape.LaunchTape.compile_kernels`` calls it once per kernel of a tape
(``StepRunner`` calls that before the first step, so before any graph capture; an unprepared tape's
first ``replay`` calls it too), and ``tape.Immediate`` before each launch: never a launch's hot path.
The handle comes from ``compat.loaded_handle`` (numba-cuda has no public accessor; without it, ``compat``
reports static shared memory only). The device checks these assumptions first: docs/gpu-runbook.md.
The simulator has no handles and needs none: its dynamic shared array holds the launch's byte count.
"""
import numba

from . import compat

SIMULATOR = bool(numba.config.ENABLE_CUDASIM)

STATIC_SHARED_LIMIT = 48 * 1024   # bytes of static shared memory per block (and of dynamic, unraised)
MAX_SHARED_PER_BLOCK = {(8, 0): 163 * 1024, (9, 0): 227 * 1024}   # static + dynamic, with the attribute raised
SMALLEST_MAX_SHARED = min(MAX_SHARED_PER_BLOCK.values())           # what a tile may use on every target

_RAISED = {}   # (handle, device) -> bytes: each compiled kernel's limit is raised once


def loaded_handle(spec):
    """``(handle, device ordinal)`` of ``spec``'s kernel compiled for its signature and loaded on the
    current device; None in the simulator."""
    if SIMULATOR:
        return None
    return compat.loaded_handle(spec.kernel.compile(spec.signature))


def set_max_dynamic_shared(handle, device, nbytes, name):
    """Set ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`` of a loaded kernel to ``nbytes``."""
    from cuda.bindings import driver
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    if isinstance(handle, driver.CUkernel):
        call, (error, *_) = "cuKernelSetAttribute", driver.cuKernelSetAttribute(attribute, nbytes, handle, device)
    elif isinstance(handle, driver.CUfunction):
        call, (error, *_) = "cuFuncSetAttribute", driver.cuFuncSetAttribute(handle, attribute, nbytes)
    else:
        raise TypeError(f"{name}: expected a CUkernel or CUfunction handle from numba-cuda, got "
                        f"{type(handle).__name__}; this numba-cuda loads kernels in a way dynamic_smem does not know")
    if error != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{name}: {call}(MAX_DYNAMIC_SHARED_SIZE_BYTES, {nbytes}) on device {device} failed with "
                           f"{error!r}; the GPU's opt-in shared memory per block is smaller than this tile's "
                           f"pipeline (sm_80: 163 KB, sm_90: 227 KB): give the kernel a smaller tile")


def raise_shared_limit(spec):
    """Raise ``spec``'s dynamic shared memory limit to ``spec.dynamic_shared_bytes`` on the current device,
    once per compiled kernel; True when this call set it. Needed only above the 48 KB default."""
    nbytes = spec.dynamic_shared_bytes
    if nbytes <= STATIC_SHARED_LIMIT:
        return False
    loaded = loaded_handle(spec)
    if loaded is None:
        return False
    handle, device = loaded
    key = (int(handle), device)
    if _RAISED.get(key) == nbytes:
        return False
    set_max_dynamic_shared(handle, device, nbytes, spec.name)
    _RAISED[key] = nbytes
    return True
