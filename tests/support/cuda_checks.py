"""What the CUDA kernel tests (``tests/cuda/test_kernels.py``, ``test_mma_conv.py``) share: fp16 inputs,
device buffers that show what a kernel left unwritten, one recorded and replayed launch, and the
comparison with the float64 spec at an output's tolerance (``TOLERANCES``, explained in
``test_kernels.py``'s docstring: relative, plus absolute as a fraction of ``max|expected|``)."""
import numpy as np
from numba import cuda

from cuda_kernels.registry import SIMULATOR
from cuda_kernels.tape import LaunchTape

if SIMULATOR:
    from tests.support.determinism import FirstLaunchChecker
    FIRST_LAUNCHES = FirstLaunchChecker()

TOLERANCES = {"fp16": (2e-3, 1e-3), "fp32": (1e-5, 1e-6), "stats": (1e-4, 1e-5), "exact": (0.0, 0.0)}


def half(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def garbage(shape, dtype):
    """An output buffer pre-filled with NaN (or 7 for integers) so unwritten elements show."""
    fill = 7 if np.issubdtype(np.dtype(dtype), np.integer) else np.nan
    return dev(np.full(shape, fill, dtype))


def f64(a):
    return np.asarray(a, np.float64)


def replay(record, launched=None):
    """Record the launches of ``record(tape)``, replay them once; returns the kernel names in launch order
    (and adds them to the set ``launched``, where given). In the simulator the first launch of each kernel
    in this process is also run a second time under contention and must give the same result
    (``tests/support/determinism.py``)."""
    tape = LaunchTape()
    record(tape)
    if SIMULATOR:
        tape.compile_kernels()
        FIRST_LAUNCHES.replay(tape)
    else:
        tape.replay()
    cuda.synchronize()
    names = tape.names()
    if launched is not None:
        launched.update(names)
    return names


def check(label, got, expected, tol):
    got = got.copy_to_host() if hasattr(got, "copy_to_host") else np.asarray(got)
    expected = np.asarray(expected)
    assert got.shape == expected.shape, f"{label}: shape {got.shape} != {expected.shape}"
    if tol == "exact":
        np.testing.assert_array_equal(got, expected, err_msg=label)
        return
    rtol, atol_frac = TOLERANCES[tol]
    atol = atol_frac * float(np.abs(expected).max(initial=0.0))
    np.testing.assert_allclose(f64(got), f64(expected), rtol=rtol, atol=atol, err_msg=label)
