"""What the GPU-only code assumes of numba-cuda, cuda-core, cuda-bindings and nccl4py, pinned without a GPU.

The code paths that only a real GPU executes (``dynamic_smem``'s handle and driver call, launches and
copies on a cuda.core stream, graph capture on a ``GraphBuilder``, the NCCL communicator) rely on
private accessors and on call signatures that no simulator test reaches. Each test here reads the
installed package (classes, signatures, source) and fails when the assumption stops holding, so a
package upgrade breaks here and not in a GPU session's first minutes (first_run.sh runs it first: docs/gpu-runbook.md). Each test says where
each was read. Runs with the real numba.cuda (no simulator), like test_ptx.py; no GPU needed.
"""
import inspect
import sys
from enum import IntEnum
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest


# ---- dynamic_smem.loaded_handle: spec.kernel.compile(sig)._codelibrary.get_cufunc() -> .handle, .device.id ----

def test_a_compiled_kernel_keeps_its_code_library_and_the_library_loads_one_function_per_device():
    from numba.cuda import codegen, dispatcher
    assert "self._codelibrary = lib" in inspect.getsource(dispatcher._Kernel.__init__)          # a fresh compile
    assert "instance._codelibrary = codelibrary" in inspect.getsource(dispatcher._Kernel._rebuild)   # the disk cache
    assert list(inspect.signature(dispatcher.CUDADispatcher.compile).parameters) == ["self", "sig"]
    get_cufunc = inspect.getsource(codegen.CUDACodeLibrary.get_cufunc)
    assert "module.get_function(self._entry_name)" in get_cufunc and "_cufunc_cache[device.id]" in get_cufunc


def test_the_loaded_function_carries_the_cuda_core_kernels_handle_and_its_contexts_device():
    from numba.cuda import _compat
    from numba.cuda.cudadrv import driver
    function = driver.CudaPythonModule.get_function
    assert "self.object_code.get_kernel(name)" in inspect.getsource(function)
    assert {"handle", "kernel"} <= set(driver.Function.__slots__)
    assert _compat.CUDA_CORE_GT_0_6   # then Function.handle is the cuda.core Kernel's .handle (not ._handle)
    assert "self.handle = kernel.handle" in inspect.getsource(driver.Function.__init__)
    assert isinstance(driver.Function.__dict__["device"], property)
    assert "return self.module.context.device" in inspect.getsource(driver.Function.__dict__["device"].fget)
    assert "self.id = self._dev.device_id" in inspect.getsource(driver.Device.__init__)   # the ordinal
    # numba-cuda sets its own attribute (the carveout) with cuKernelSetAttribute on that handle, as we do
    assert "cuKernelSetAttribute(attr, carveout, self.handle, self.device.id)" in \
        inspect.getsource(driver.Function.set_shared_memory_carveout)


def test_a_cuda_core_kernels_handle_is_a_cukernel():
    import cuda.core
    from cuda.core._module import Kernel   # the class of Function.kernel, whose .handle Function keeps
    assert hasattr(Kernel, "handle")
    header = Path(cuda.core.__file__).parent / "_cpp" / "resource_handles.hpp"
    if not header.exists():
        pytest.skip(f"cuda-core {cuda.core.__version__} ships no {header.name}: Kernel.handle's type is "
                    f"checked by gpu_check's preflight on a GPU only")
    text = header.read_text()
    assert "using KernelHandle = std::shared_ptr<const CUkernel>;" in text
    assert 'as_py(const KernelHandle& h) noexcept {\n    return detail::make_py("cuda.bindings.driver", "CUkernel"' \
        in text


# ---- the driver calls: parameter order and the attribute ------------------------------------------------------

DRIVER_CALLS = [  # (cuda.bindings.driver function, its parameters in order) as dynamic_smem / the preflight call it
    ("cuKernelSetAttribute", ["attrib", "val", "kernel", "dev"]),
    ("cuFuncSetAttribute", ["hfunc", "attrib", "value"]),
    ("cuKernelGetAttribute", ["attrib", "kernel", "dev"]),
    ("cuFuncGetAttribute", ["attrib", "hfunc"]),
]


@pytest.mark.parametrize("name, parameters", DRIVER_CALLS, ids=[c[0] for c in DRIVER_CALLS])
def test_the_driver_functions_take_their_arguments_in_the_order_used(name, parameters):
    from cuda.bindings import driver
    assert list(inspect.signature(getattr(driver, name)).parameters) == parameters


def test_the_max_dynamic_shared_attribute_and_the_handle_types_exist():
    from cuda.bindings import driver
    assert int(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) == 8   # cuda.h's value
    assert int(driver.CUkernel(7)) == 7 and not isinstance(driver.CUkernel(7), driver.CUfunction)


# ---- launches: the 4th configuration item, cuda.core streams and graph builders --------------------------------

def test_a_launch_configuration_takes_grid_block_stream_and_dynamic_shared_bytes():
    from numba.cuda import dispatcher
    assert list(inspect.signature(dispatcher.CUDADispatcher.configure).parameters) == \
        ["self", "griddim", "blockdim", "stream", "sharedmem"]
    assert "len(args) not in [2, 3, 4]" in inspect.getsource(dispatcher.CUDADispatcher.__getitem__)
    launch = inspect.getsource(dispatcher._Kernel.launch)
    assert "shmem_size=sharedmem" in launch and "launch(stream, config, kernel, *kernelargs)" in launch


def test_a_launch_accepts_a_cuda_core_stream_and_a_graph_builder():
    import cuda.core
    import cuda.core.graph
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv import driver
    assert driver.ExperimentalStream is cuda.core.Stream and driver.GraphBuilder is cuda.core.graph.GraphBuilder
    to_core = inspect.getsource(driver._to_core_stream)
    assert "isinstance(stream, ExperimentalStream)" in to_core
    assert "isinstance(stream, GraphBuilder)" in to_core and "return stream.stream" in to_core   # captures
    assert "driver._to_core_stream(stream)" in inspect.getsource(dispatcher._LaunchConfiguration.__init__)
    # CUDADispatcher.configure is functools.lru_cache'd: the stream is part of a cache key
    assert hasattr(dispatcher.CUDADispatcher.configure, "cache_info")
    assert cuda.core.Stream.__hash__ is not None and cuda.core.graph.GraphBuilder.__hash__ is not None


def test_copies_and_events_accept_a_cuda_core_stream():
    from numba.cuda.cudadrv import driver
    handle = inspect.getsource(driver._stream_handle)
    assert "allowed = (Stream, ExperimentalStream)" in handle and "stream.__cuda_stream__()" in handle
    for copy in (driver.host_to_device, driver.device_to_host):
        assert "_stream_handle(stream)" in inspect.getsource(copy)
    assert "_stream_handle(stream)" in inspect.getsource(driver.Event.record)


CUDA_CORE_API = [  # (object path, attributes) the CUDA path calls (graph, executor, gpu_check's preflight)
    ("Device", ("set_current", "create_stream", "create_graph_builder", "sync")),
    ("Stream", ("sync", "__cuda_stream__", "handle")),
    ("graph.GraphBuilder", ("begin_building", "end_building", "complete", "stream", "__cuda_stream__")),
    ("graph.Graph", ("launch", "upload", "close")),
]


@pytest.mark.parametrize("path, attributes", CUDA_CORE_API, ids=[c[0] for c in CUDA_CORE_API])
def test_the_cuda_core_api_the_graph_path_calls_exists(path, attributes):
    import cuda.core
    import cuda.core.graph  # noqa: F401
    owner = cuda.core
    for part in path.split("."):
        owner = getattr(owner, part)
    assert [a for a in attributes if not hasattr(owner, a)] == []


def test_numba_and_cuda_core_share_the_primary_context():
    """``graph.new_stream`` makes cuda.core's context current before numba allocates the arena; numba
    attaches to a current context only if it is the device's primary one, which is what cuda.core makes."""
    import cuda.core
    from numba.cuda.cudadrv import devices
    uncached = inspect.getsource(devices._Runtime._get_or_create_context_uncached)
    assert "get_primary_context()" in uncached and "Numba cannot operate on non-primary" in uncached
    assert "By default the primary context is used" in " ".join(cuda.core.Device.set_current.__doc__.split())


def test_a_new_cuda_core_stream_is_non_blocking_by_default():
    from cuda.core import StreamOptions   # Device().create_stream() with no options: capture needs non-blocking
    assert StreamOptions().nonblocking is True


def test_the_executor_uses_cuda_core_streams_and_builders_on_a_gpu():
    from cuda_kernels import compat, graph
    assert "compat.core_stream()" in inspect.getsource(graph.new_stream)
    assert "compat.core_graph_builder()" in inspect.getsource(graph.new_graph_builder)
    assert "device.create_stream()" in inspect.getsource(compat.core_stream)
    assert "device.create_graph_builder()" in inspect.getsource(compat.core_graph_builder)
    capture = inspect.getsource(graph.capture_graph)
    assert "builder.begin_building()" in capture and "graph.complete()" in capture


# ---- nccl4py (NcclCollectives): its 0.6 surface, from its source --------------------------------------------------

class _UniqueId:
    """nccl4py 0.6's ``nccl.core.UniqueId``: 128 bytes, ``as_bytes`` a *property*, ``bytes(uid)``, ``from_bytes``."""

    def __init__(self, data=bytes(128)):
        self.data = bytes(data)

    def __bytes__(self):
        return self.data

    @property
    def as_bytes(self):
        return bytes(self)

    @staticmethod
    def from_bytes(b):
        return _UniqueId(b)


class _NcclRedOp(IntEnum):
    SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4


class _Communicator:
    made = []

    @classmethod
    def init(cls, nranks, rank, unique_id, config=None):
        cls.made.append((nranks, rank, bytes(unique_id)))
        return cls()

    def allreduce(self, sendbuf, recvbuf, op, *, stream=None, config=None):
        self.call = (sendbuf, recvbuf, op, stream)


@pytest.fixture
def nccl_stand_in(monkeypatch):
    """``nccl.core`` with nccl4py 0.6's names and signatures (read from the nccl4py-0.6.0 wheel)."""
    core = ModuleType("nccl.core")
    core.UniqueId, core.NcclRedOp, core.Communicator = _UniqueId, _NcclRedOp, _Communicator
    core.get_unique_id = lambda empty=False: _UniqueId() if empty else _UniqueId(bytes(range(128)))
    package = ModuleType("nccl")
    package.core = core
    monkeypatch.setitem(sys.modules, "nccl", package)
    monkeypatch.setitem(sys.modules, "nccl.core", core)
    _Communicator.made = []
    return core


@pytest.mark.parametrize("rank", [0, 1])
def test_nccl_collectives_bootstrap_and_reduce_with_nccl4pys_own_signatures(nccl_stand_in, rank):
    from cuda_kernels.collective import NcclCollectives
    sent = {}

    def broadcast(array, what):   # rank 0's bytes reach every rank (torch.distributed's broadcast, in place)
        assert array.dtype == np.uint8 and array.size == 128, what
        array[:] = np.arange(128, dtype=np.uint8)
        sent["what"] = what
    dist = SimpleNamespace(is_writer=rank == 0, rank=rank, world_size=2, broadcast=broadcast, sync_batchnorm=True)
    collectives = NcclCollectives(dist)
    assert _Communicator.made == [(2, rank, bytes(range(128)))] and sent["what"] == "NCCL unique id broadcast"
    assert (collectives.world_size, collectives.sync_batchnorm) == (2, True)   # the BN sums' all-reduces
    buffer, builder = object(), object()
    for op, nccl_op in (("avg", _NcclRedOp.AVG), ("max", _NcclRedOp.MAX), ("sum", _NcclRedOp.SUM)):
        collectives.all_reduce(buffer, op, builder)
        assert collectives.communicator.call == (buffer, buffer, nccl_op, builder)


# ---- device attributes gpu_check reads (versions record, preflight) ----------------------------------------------

DEVICE_ATTRIBUTES = ("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", "MULTIPROCESSOR_COUNT", "CLOCK_RATE", "MEMORY_CLOCK_RATE")


def test_numba_devices_read_the_attributes_gpu_check_asks_for_by_their_driver_names():
    from cuda.bindings import driver as bindings
    from numba.cuda.cudadrv import driver
    assert 'f"CU_DEVICE_ATTRIBUTE_{attr}"' in inspect.getsource(driver.Device.__getattr__)
    assert [a for a in DEVICE_ATTRIBUTES if not hasattr(bindings.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{a}")] == []
    assert callable(driver.Driver.get_version)
