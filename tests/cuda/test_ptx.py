"""Every kernel of the table compiles for sm_90 with the exact signature its launcher
passes, and contains no fp64 arithmetic (the Python-float-literal trap of CUDA-NOTES.md).

Runs WITHOUT NUMBA_ENABLE_CUDASIM (compile_ptx needs the real numba.cuda); no GPU needed.
"""
import re
from types import SimpleNamespace

import numpy as np
import pytest
from numba import cuda

from cuda_kernels._registry import H1, all_kernels, nbt

CC = (9, 0)
# An opcode with an f64 type (``add.f64``, ``fma.rn.f64``, ``cvt.f64.f32``, ``cvt.rn.f16.f64``, ...)
# at the start of an instruction, optionally predicated. Register *names* such as ``%f64``
# (the 64th fp32 register) are operands and do not match.
FP64_OPCODE = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*\.f64(?:\.[a-z0-9_]+)*)\b", re.M)
FP64_REGISTERS = re.compile(r"\.reg\s+\.f64\b")


def fp64_instructions(ptx):
    return sorted(set(FP64_OPCODE.findall(ptx))) + FP64_REGISTERS.findall(ptx)


@pytest.fixture(scope="module", autouse=True)
def device_functions_target_sm90():
    """Device functions called by a kernel are compiled for the *current* device's
    compute capability, which needs a driver; without a GPU, say sm_90."""
    if cuda.is_available():
        yield
        return
    import numba.cuda.dispatcher as dispatcher
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dispatcher, "get_current_device", lambda: SimpleNamespace(compute_capability=CC))
        yield


def _fp16_literal_trap(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = nbt.float16(nbt.float32(x[i]) * 2.5)   # 2.5 is fp64: the trap the check must catch


def _fp16_typed(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = nbt.float16(nbt.float32(x[i]) * np.float32(2.5))


def test_the_fp64_detector_sees_the_literal_trap_and_only_it():
    bad, _ = cuda.compile_ptx(_fp16_literal_trap, (H1, H1), cc=CC)
    good, _ = cuda.compile_ptx(_fp16_typed, (H1, H1), cc=CC)
    assert {"mul.f64", "cvt.f64.f32", "cvt.rn.f16.f64"} <= set(fp64_instructions(bad))
    assert fp64_instructions(good) == []


@pytest.mark.parametrize("name", sorted(all_kernels()))
def test_kernel_compiles_for_sm90_without_fp64(name):
    spec = all_kernels()[name]
    ptx, return_type = cuda.compile_ptx(spec.pyfunc, spec.signature, cc=CC)
    assert ".target sm_90" in ptx
    assert str(return_type) == "none"
    assert fp64_instructions(ptx) == [], f"{name} contains fp64 arithmetic"
