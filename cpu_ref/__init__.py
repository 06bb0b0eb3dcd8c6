"""The CPU reference path: numba kernels (fp32, NHWC) and the arena executor.

`planner.reference` (plain numpy) is the spec every kernel is tested against;
`cpu_ref.kernels` holds the numba kernels the executors call (docs/kernel-contract.md).
"""
import os

# numba's OpenMP threads otherwise spin for a while after every parallel region, waiting for
# the next one. The kernels run one region per op, so the spinning threads compete with the
# one doing the work whenever the cores are shared (another process, BLAS threads); on a
# busy 2-core machine that made training several times slower. Sleeping threads cost a
# wake-up of some microseconds per region instead. Must be set before numba loads OpenMP
# (its first parallel call); an explicit setting by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from cpu_ref._cache_dir import use_user_cache_dir  # noqa: E402

use_user_cache_dir()    # before any kernel is decorated: numba picks a kernel's cache folder then

from cpu_ref._executor import CpuExecutor, InputError  # noqa: E402

__all__ = ["CpuExecutor", "InputError"]
