"""CUDA kernel tests: two tiers, two separate pytest processes.

Simulator tier (every file but test_ptx.py): the kernels run in numba's CUDA simulator,
which must be switched on before numba is imported, hence its own process:

    NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=. python -m pytest tests/cuda -q

(On a machine with a GPU the same tests run on it without the variable.)

PTX tier (test_ptx.py, and test_gpu_assumptions.py, which reads the installed numba-cuda): both need
the real numba.cuda, so they run WITHOUT the variable (no GPU needed, only the nvidia-cuda-nvrtc wheel):

    PYTHONPATH=. python -m pytest tests/cuda/test_ptx.py tests/cuda/test_gpu_assumptions.py -q

A plain ``pytest tests`` run collects both and skips the tier its process cannot run,
with the reason.
"""
from pathlib import Path

import numba
import pytest
from numba import cuda

SIMULATOR = bool(numba.config.ENABLE_CUDASIM)
GPU = not SIMULATOR and cuda.is_available()
if SIMULATOR:   # the simulator's block barrier, counted instead of polled: ~40% less CPU per launch, same semantics
    from tests.support import block_barrier
    block_barrier.install()

_NEEDS_KERNELS = ("CUDA kernel tests need the simulator or a GPU: run them in their own process with "
                  "`NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=. python -m pytest tests/cuda` (the variable must be "
                  "set before numba is imported)")
_NEEDS_REAL_NUMBA_CUDA = ("compile_ptx and the package checks need the real numba.cuda, not the simulator: run "
                          "`PYTHONPATH=. python -m pytest tests/cuda/test_ptx.py tests/cuda/test_gpu_assumptions.py` "
                          "without NUMBA_ENABLE_CUDASIM")


_HERE = Path(__file__).parent
# Files that need the real numba.cuda (compile_ptx; the installed packages' classes and signatures) and no GPU
REAL_NUMBA_CUDA_FILES = ("test_ptx.py", "test_gpu_assumptions.py", "test_sass_budget.py", "test_vector_access.py")


def pytest_collection_modifyitems(config, items):
    for item in items:   # the hook sees the whole session: only touch this directory's tests
        if item.path.parent != _HERE:
            continue
        if item.path.name in REAL_NUMBA_CUDA_FILES:
            if SIMULATOR:
                item.add_marker(pytest.mark.skip(reason=_NEEDS_REAL_NUMBA_CUDA))
        elif not (SIMULATOR or GPU):
            item.add_marker(pytest.mark.skip(reason=_NEEDS_KERNELS))
