"""The CUDA path: numba.cuda fp16 kernels (AMP), the device arena, launch tapes and graph replay.

The kernels, arena, tape and graph runner are here and tested (simulator + compile_ptx);
the plan-driven `CudaExecutor` that wires them to a CompiledPlan is not written yet, so
`DeepLearningTask.device("cuda")` raises a clear error instead of silently running on the CPU.
"""


class CudaExecutor:
    """Placeholder that refuses to run: the plan-driven CUDA executor does not exist yet."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("the CUDA executor is not available in this version of blueprint-nn (no plan-driven "
                           "GPU executor yet, with or without a GPU); train with .device('cpu')")


__all__ = ["CudaExecutor"]
