"""The one module that imports cuda.core or numba-cuda's private names: what this install has, and the
fallback taken where it lacks something (the versions record of benchmarks.gpu reports ``features()``).

    graph-capture      cuda.core >= 1.0: ``cuda.core.Device``, ``cuda.core.graph.GraphBuilder``
                       missing -> eager replay (one launch per kernel), numba's own streams
    dynamic-shared     numba-cuda's ``CUDACodeLibrary.get_cufunc`` (no public accessor for a loaded kernel's
                       handle), to raise MAX_DYNAMIC_SHARED_SIZE_BYTES above 48 KB
                       missing -> static shared memory only: tiles whose pipeline needs more run SIMT
    shared-alignment   ``cuda.shared.array(..., alignment=)`` (numba-cuda >= 0.20), which every mma kernel uses
                       missing -> no tensor-core kernels: every GEMM runs SIMT
    disk-cache         numba-cuda's disk cache, only when ``BLUEPRINT_CUDA_CACHE`` is 1 (compile and save) or
                       read (load only; the GPU check's units after its warm-up; NUMBA_CACHE_DIR says where): a kernel JIT-compiled in one process is loaded from
                       disk by the next; never by default (no cache written beside an installed package). Keyed
                       by the kernel's table name and the source of cuda_kernels (``NamedKernelCache``): numba's
                       own key pickles a closure's cells, and the tensor-core kernels close over device
                       functions whose pickles differ from process to process (a miss every time)

Each probe takes its module as an argument (the tests pass stand-ins for older packages)."""
import importlib
import inspect
import os
from dataclasses import dataclass

import numba

SIMULATOR = bool(numba.config.ENABLE_CUDASIM)


@dataclass(frozen=True)
class Feature:
    name: str
    available: bool
    why: str          # what is missing ("" when available)
    fallback: str     # what runs instead when it is missing

    def record(self):
        return {"available": self.available, "missing": self.why, "fallback": "" if self.available else self.fallback}


def _import(name):
    return importlib.import_module(name)


def graph_capture(import_module=_import):
    try:
        core = import_module("cuda.core")
        graph = import_module("cuda.core.graph")
        missing = [n for module, n in ((core, "Device"), (graph, "GraphBuilder")) if not hasattr(module, n)]
    except ImportError as error:
        missing = [f"{error}"]
    why = f"cuda.core graph API unavailable ({'; '.join(missing)}); cuda-core>=1.0 has it" if missing else ""
    return Feature("graph-capture", not missing, why, "eager replay (one launch per kernel), numba streams")


def dynamic_shared(import_module=_import):
    try:
        codegen = import_module("numba.cuda.codegen")
        ok = hasattr(getattr(codegen, "CUDACodeLibrary", None), "get_cufunc")
    except ImportError:
        ok = False
    why = "" if ok else "numba.cuda.codegen.CUDACodeLibrary.get_cufunc (a loaded kernel's handle) is missing"
    return Feature("dynamic-shared", ok, why, "static shared memory only: tiles above 48 KB run SIMT")


def shared_alignment(import_module=_import):
    try:
        decl = import_module("numba.cuda.cudadecl").Cuda_array_decl
        ok = "alignment" in inspect.signature(decl.generic(None)).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        ok = False
    why = "" if ok else "cuda.shared.array has no alignment= keyword (numba-cuda < 0.20)"
    return Feature("shared-alignment", ok, why, "no tensor-core kernels: every GEMM runs SIMT")


def disk_cache(environ=os.environ):
    on = environ.get("BLUEPRINT_CUDA_CACHE") in ("1", "read") and not SIMULATOR
    return Feature("disk-cache", on, "" if on else "off (BLUEPRINT_CUDA_CACHE=1 writes and reads it, =read reads it)",
                   "each process JIT-compiles the kernels it launches")


def features():
    """``{name: Feature}`` of this install. The simulator runs every kernel as Python: its own shared arrays
    (dynamic ones sized by the launch, no alignment) need neither probe, and it has no graphs (``graph``)."""
    if SIMULATOR:
        simulated = [Feature(f.name, True, "", f.fallback) for f in (dynamic_shared(_no_import), shared_alignment(
            _no_import))]
        return {f.name: f for f in (graph_capture(), *simulated, disk_cache())}
    return {f.name: f for f in (graph_capture(), dynamic_shared(), shared_alignment(), disk_cache())}


def _no_import(name):
    raise ImportError(f"{name}: not probed in the simulator")


FEATURES = features()


def source_digest(folder=None):
    """sha256 of every ``.py`` of cuda_kernels: any change to the kernels' source is a new cache key."""
    import hashlib
    from pathlib import Path
    digest = hashlib.sha256()
    for path in sorted(Path(folder or Path(__file__).parent).glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def named_kernel_cache(pyfunc, name, digest):
    """numba-cuda's ``CUDACache`` for ``pyfunc`` keyed by (signature, target, numba-cuda version, ``name``,
    ``digest``, bytecode) instead of a pickle of the closure."""
    import hashlib

    import numba_cuda
    from numba.cuda.dispatcher import CUDACache

    from numba.cuda.core.caching import IndexDataCacheFile

    class NamedKernelCache(CUDACache):
        def __init__(self, py_func):
            super().__init__(py_func)
            # a file per kernel: no two processes compiling different kernels write one index
            self._cache_file = IndexDataCacheFile(cache_path=self._cache_path,
                                                  filename_base=f"{self._impl.filename_base}-{name}",
                                                  source_stamp=self._impl.locator.get_source_stamp())

        def save_overload(self, sig, data):
            if os.environ.get("BLUEPRINT_CUDA_CACHE") == "1":   # "read": only the warm-up writes
                super().save_overload(sig, data)

        def _index_key(self, sig, codegen):
            key = (sig, codegen.magic_tuple(), numba_cuda.__version__,
                   (name, digest, hashlib.sha256(pyfunc.__code__.co_code).hexdigest()))
            return key if self._launch_config_key is None else key + (("launch_config", self._launch_config_key),)
    return NamedKernelCache(pyfunc)


def jit_kernel(pyfunc, name):
    """``cuda.jit(pyfunc)``; with the disk cache (``NamedKernelCache``) when ``disk-cache`` is on."""
    from numba import cuda
    dispatcher = cuda.jit(pyfunc)
    if FEATURES["disk-cache"].available:
        dispatcher._cache = named_kernel_cache(pyfunc, name, _digest())
    return dispatcher


def _digest():
    if not hasattr(_digest, "value"):
        _digest.value = source_digest()
    return _digest.value


def loaded_handle(compiled):
    """``(CUkernel or CUfunction, device ordinal)`` of a compiled numba-cuda kernel, loaded on the current device."""
    if not FEATURES["dynamic-shared"].available:
        raise RuntimeError(FEATURES["dynamic-shared"].why)
    cufunc = compiled._codelibrary.get_cufunc()
    return cufunc.handle, cufunc.device.id


def core_stream():
    """A non-blocking cuda.core stream on the current device (graph capture needs one)."""
    from cuda.core import Device
    device = Device()
    device.set_current()
    return device.create_stream()


def core_graph_builder():
    from cuda.core import Device
    device = Device()
    device.set_current()
    return device.create_graph_builder()
