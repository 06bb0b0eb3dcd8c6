"""The CUDA path: numba.cuda fp16 kernels (AMP), the device arena, launch tapes and graph replay.

`CudaExecutor` runs a CompiledPlan built with ``amp=True`` (fused or not) in one device
arena, replaying each recorded step eagerly or as one CUDA graph. Without a GPU it refuses
with a clear error, unless numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1`` before
numba is imported), where the same kernels run on the CPU for tiny shapes.
"""
try:
    import numba_cuda  # noqa: F401  (without it, numba >= 0.61's own numba.cuda lacks what the kernels use)
except ImportError as error:
    raise ImportError("numba-cuda is not installed (numba's own numba.cuda cannot run these kernels); "
                      "pip install \".[cuda]\" in the blueprint-nn source tree (\".[cuda12]\" for a CUDA 12 driver)") from error

from cuda_kernels.executor import CudaExecutor, InputError, cuda_unavailable_reason  # noqa: E402

__all__ = ["CudaExecutor", "InputError", "cuda_unavailable_reason"]
