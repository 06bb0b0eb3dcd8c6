"""The CPU reference path: numba kernels (fp32, NHWC) and the arena executor.

`cpu_ref.reference` (plain numpy) is the spec every kernel is tested against;
`cpu_ref.kernels` holds the numba kernels the executors call (docs/kernel-contract.md).
"""
from cpu_ref._executor import CpuExecutor, InputError

__all__ = ["CpuExecutor", "InputError"]
