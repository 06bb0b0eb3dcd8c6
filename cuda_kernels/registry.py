"""The kernel table: every CUDA kernel with the one argument signature it is launched with.

Each kernel is declared with ``@kernel(name, signature)``. The signature is the list of
numba types of its arguments; the launchers must pass exactly those types (checked at
record time by ``check_args``) and ``tests/cuda/test_ptx.py`` compiles every row of
``KERNELS`` for sm_90 with the same signature. So what is compiled in CI is what runs.

Conventions of every kernel in this package:
- arrays are C-contiguous device views (mostly flat 1-D); storage fp16 for activations
  and weight copies, fp32 for parameters, gradients, optimizer state and statistics;
- arithmetic is fp32 (``f32(x[i])``) with typed constants (``np.float32``): a Python
  float literal is fp64 on the device, which ``tests/cuda/test_ptx.py`` rejects in fp16 kernels;
- scalars that are fixed for a captured step (shapes, flags, momentum, eps) are kernel
  arguments; everything that changes per step (lr, step, loss scale, overflow flag)
  is read from 1-element device arrays.
"""
import importlib
import inspect
import math
from dataclasses import dataclass

import numba
import numpy as np
from numba.cuda import types as nbt

from .compat import jit_kernel

SIMULATOR = bool(numba.config.ENABLE_CUDASIM)
if SIMULATOR:
    from ._simulator import install as _install_simulator_fix
    _install_simulator_fix()   # shared arrays allocated atomically (see _simulator)

F16, F32, I32, U8, U32, U64 = nbt.float16, nbt.float32, nbt.int32, nbt.uint8, nbt.uint32, nbt.uint64


def vec(dtype):
    """Type of a flat C-contiguous device array."""
    return nbt.Array(dtype, 1, "C")


H1, F1, I1, B1, W1 = vec(F16), vec(F32), vec(I32), vec(U8), vec(U32)


def geometry(n):
    """Type of an ``n``-int32 shape tuple (see ``int32_tuple``)."""
    return nbt.UniTuple(I32, n)


# Typed constants shared by the kernels (a bare ``0.5`` would be fp64 on the device).
# No fp16 constants: a global np.float16 lowers to invalid NVVM IR; write ``f16(ZERO)``.
ZERO, ONE, HALF = np.float32(0.0), np.float32(1.0), np.float32(0.5)

# Elementwise kernels use grid-stride loops, so block and grid sizes are free. The
# simulator starts one Python thread per CUDA thread at every launch: small ones keep it fast.
THREADS = 8 if SIMULATOR else 256
MAX_BLOCKS = 2 if SIMULATOR else 8192


def grid_1d(n, threads=THREADS):
    """``(blocks, threads)`` for a grid-stride loop over ``n`` elements."""
    return max(1, min(math.ceil(n / threads), MAX_BLOCKS)), threads


def flat(a):
    """The 1-D view of a C-contiguous array (what every kernel takes)."""
    return a.reshape(a.size)


def int32_tuple(*values):
    return tuple(np.int32(v) for v in values)


@dataclass(frozen=True)
class KernelSpec:
    """One row of the kernel table."""
    name: str
    pyfunc: object      # the Python source function (compile_ptx input)
    kernel: object      # the ``cuda.jit`` dispatcher (lazy; compiled on first launch)
    signature: tuple    # numba types, one per argument
    argnames: tuple
    dynamic_shared_bytes: int = 0   # launched with this much dynamic shared memory (``dynamic_smem``)

    def compile(self):
        """Compile for ``signature`` now (before graph capture); no-op in the simulator.

        numba-cuda's dispatcher, unlike numba's CPU one, fires no "numba:compile" event, so a
        real compile (the signature not yet in memory) is wrapped in that event here: ``fit()``'s
        compile notice and its img/s correction (``blueprint.task._console.CompileWatch``) then
        see the CUDA kernels' compile time as they see the CPU kernels'."""
        if SIMULATOR or tuple(self.signature) in self.kernel.overloads:
            return
        from numba.core import event
        with event.trigger_event("numba:compile", data={"dispatcher": self.kernel, "args": self.signature,
                                                        "return_type": None}):
            self.kernel.compile(self.signature)


KERNELS = {}


def kernel(name, signature):
    """Declare a kernel and its launch signature; returns its ``KernelSpec``."""
    def declare(pyfunc):
        if name in KERNELS:
            raise ValueError(f"kernel: duplicate kernel name {name!r}")
        argnames = tuple(inspect.signature(pyfunc).parameters)
        if len(argnames) != len(signature):
            raise ValueError(f"kernel {name!r}: {len(argnames)} parameters but {len(signature)} types")
        spec = KernelSpec(name, pyfunc, jit_kernel(pyfunc, name), tuple(signature), argnames)
        KERNELS[name] = spec
        return spec
    return declare


def check_args(spec, args, host_stand_ins=False):
    """Raise ``TypeError`` unless ``args`` have exactly the types of ``spec.signature``.

    ``host_stand_ins``: numpy arrays stand for device arrays of the same type (the
    ``--dry-run`` of benchmarks/gpu/check.py, which has no device); never for launches.
    """
    if len(args) != len(spec.signature):
        raise TypeError(f"{spec.name}: expects {len(spec.signature)} arguments {spec.argnames}, got {len(args)}")
    for name, arg, expected in zip(spec.argnames, args, spec.signature):
        if isinstance(arg, np.ndarray) and not host_stand_ins:
            raise TypeError(
                f"{spec.name}: argument {name!r} is a host numpy array {arg.dtype}{arg.shape}. Kernels take "
                f"device arrays only (numba would copy a host array at every launch, which breaks graph "
                f"capture); pass a view of the device arena instead")
        got = numba.typeof(arg)
        if got != expected:
            raise TypeError(f"{spec.name}: argument {name!r} expects {expected}, got {got}")


KERNEL_MODULES = ("elementwise", "batchnorm", "pool", "_conv", "_depthwise", "_linear", "loss", "optim",
                  "channel_mul", "drop_path", "prelu", "zero_ranges", "padded_conv")


def all_kernels():
    """The complete table of SIMT kernels (imports each module of ``KERNEL_MODULES``; the tensor-core
    kernels are declared in the modules of ``mma_kernels.MMA_KERNEL_MODULES``)."""
    for module in KERNEL_MODULES:
        importlib.import_module(f"{__package__}.{module}")
    return dict(KERNELS)

