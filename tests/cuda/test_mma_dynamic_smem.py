"""Tiles above 48 KB of shared memory (``dynamic_smem``): the 128x128 input and weight gradients.

Which kernels take dynamic shared memory; the launch path passing the byte count, and the limit raised
once per kernel before its first launch and before a graph capture, by the tape (``compile_kernels``,
which ``StepRunner`` calls) or ``Immediate``, never per launch (handle and driver call replaced by
stand-ins that record them: the simulator has neither); the driver call itself on stand-in handles;
the static + dynamic bytes check. The kernels run against the numpy spec in test_mma_conv.py, and
assemble within the limits in test_ptx.py.
"""
from types import SimpleNamespace

import pytest
from cuda.bindings import driver

from cuda_kernels import dynamic_smem, mma_dgrad, mma_wgrad
from cuda_kernels.mma_static import MAX_SHARED_PER_BLOCK, shared_fits
from cuda_kernels.mma_tiles import GPU_TILES, MMA_KERNELS, pipeline_bytes
from cuda_kernels.registry import SIMULATOR, KernelSpec
from cuda_kernels.tape import Immediate, Launch, LaunchTape

WIDE = GPU_TILES[0]   # 128x128, 8 warps (its kernels against the spec: test_mma_conv.py)


def _stand_in_handle(spec):
    return driver.CUkernel(len(spec.name)), 0


@pytest.fixture
def stand_in_driver(monkeypatch):
    """``raise_shared_limit``'s handle and driver call replaced: ``[(handle, device, bytes, kernel name)]``."""
    calls = []
    monkeypatch.setattr(dynamic_smem, "_RAISED", {})
    monkeypatch.setattr(dynamic_smem, "loaded_handle", _stand_in_handle)
    monkeypatch.setattr(dynamic_smem, "set_max_dynamic_shared", lambda *call: calls.append(call))
    return calls


def test_the_wide_backward_tiles_take_dynamic_shared_memory_and_the_forward_does_not():
    dgrad, wgrad = mma_dgrad.DGRAD[WIDE], mma_wgrad.WGRAD[WIDE]
    assert WIDE in mma_dgrad.DGRAD_TILES and WIDE in mma_wgrad.WGRAD_TILES
    assert dgrad.dynamic_shared_bytes == pipeline_bytes(WIDE, False, True) == 3 * (128 * 64 + 32 * 136 * 2) == 50688
    assert wgrad.dynamic_shared_bytes == pipeline_bytes(WIDE, True, True) == 52224
    assert MMA_KERNELS[f"mma_conv2d_forward_{WIDE.name}"].dynamic_shared_bytes == 0   # exactly 48 KB: static
    dynamic = {name for name, spec in MMA_KERNELS.items() if spec.dynamic_shared_bytes}
    assert dynamic == {dgrad.name, wgrad.name}


def test_the_wide_kernels_raise_their_own_byte_count(stand_in_driver):
    for spec in (mma_dgrad.DGRAD[WIDE], mma_wgrad.WGRAD[WIDE]):
        assert dynamic_smem.raise_shared_limit(spec) and not dynamic_smem.raise_shared_limit(spec)
    assert [call[2:] for call in stand_in_driver] == [(50688, mma_dgrad.DGRAD[WIDE].name),
                                                      (52224, mma_wgrad.WGRAD[WIDE].name)]


# ---- the launch path, on a stand-in kernel (records its launch configuration) ------------------------------------
class _Configurations:
    """A stand-in ``cuda.jit`` dispatcher: appends ``("launch", configuration)`` to ``log`` at each launch."""
    overloads = {(): None}   # compiled for the stand-in's empty signature: KernelSpec.compile has nothing to do

    def __init__(self, log):
        self.log = log

    def __getitem__(self, configuration):
        return lambda *args: self.log.append(("launch", configuration))


def _spec(nbytes, log, name="stand_in"):
    return KernelSpec(name, None, _Configurations(log), (), (), nbytes)


def _raised(name="stand_in", nbytes=60 * 1024):
    """The record of ``stand_in_driver`` for one raise of ``name``'s limit."""
    return (driver.CUkernel(len(name)), 0, nbytes, name)


def test_a_launch_passes_the_dynamic_bytes_and_looks_nothing_up(stand_in_driver):
    spec = _spec(60 * 1024, stand_in_driver)
    for stream in ("s1", "s2"):
        Launch(spec, (2, 1, 1), 256, ()).run(stream)
    assert stand_in_driver == [("launch", ((2, 1, 1), 256, "s1", 60 * 1024)),
                               ("launch", ((2, 1, 1), 256, "s2", 60 * 1024))]


def test_a_tape_raises_each_limit_once_before_its_first_launch(stand_in_driver):
    spec = _spec(60 * 1024, stand_in_driver)
    tape = LaunchTape()
    tape.launch(spec, (2, 1, 1), 256)
    tape.launch(spec, (1, 1, 1), 256)
    tape.replay("s")
    tape.replay("s")
    launches = [("launch", ((2, 1, 1), 256, "s", 60 * 1024)), ("launch", ((1, 1, 1), 256, "s", 60 * 1024))]
    assert stand_in_driver == [_raised()] + launches + launches


def test_a_kernel_recorded_after_the_first_replay_is_raised_before_its_own(stand_in_driver):
    tape = LaunchTape()
    tape.launch(_spec(60 * 1024, stand_in_driver), 1, 32)
    tape.replay(0)
    tape.launch(_spec(56 * 1024, stand_in_driver, "later"), 1, 32)
    tape.replay(0)
    assert stand_in_driver == [_raised(), ("launch", (1, 32, 0, 60 * 1024)),
                               _raised("later", 56 * 1024), ("launch", (1, 32, 0, 60 * 1024)),
                               ("launch", (1, 32, 0, 56 * 1024))]


def test_a_step_runner_raises_every_limit_before_the_first_step_and_before_the_capture(stand_in_driver, monkeypatch):
    from cuda_kernels import graph

    def capture(kernels):
        stand_in_driver.append(("capture", [entry.name for entry in kernels]))
        return SimpleNamespace(launch=lambda stream: stand_in_driver.append(("graph launch", stream)))
    monkeypatch.setattr(graph, "graph_support", lambda: (True, ""))
    monkeypatch.setattr(graph, "capture_graph", capture)
    tape = LaunchTape()
    tape.launch(_spec(60 * 1024, stand_in_driver), 1, 32)
    runner = graph.StepRunner(tape, "graph")
    assert stand_in_driver == [_raised()]   # StepRunner compiles (and raises) before any step
    stream = SimpleNamespace(sync=lambda: None)
    runner.run(stream)
    runner.run(stream)
    assert stand_in_driver == [_raised(), ("launch", (1, 32, stream, 60 * 1024)), ("capture", ["stand_in"]),
                               ("graph launch", stream)]


def test_an_immediate_launch_raises_the_limit_once_then_launches(stand_in_driver):
    spec = _spec(60 * 1024, stand_in_driver)
    for _ in range(2):
        Immediate("s").launch(spec, 1, 32)
    assert stand_in_driver == [_raised(), ("launch", (1, 32, "s", 60 * 1024)), ("launch", (1, 32, "s", 60 * 1024))]


@pytest.mark.parametrize("nbytes", [0, 48 * 1024], ids=["static", "dynamic-within-the-default"])
def test_no_limit_is_raised_at_or_below_48_kb(stand_in_driver, nbytes):
    tape = LaunchTape()
    tape.launch(_spec(nbytes, stand_in_driver), (1, 1, 1), 32)
    tape.replay(0)
    Immediate(0).launch(_spec(nbytes, stand_in_driver), (1, 1, 1), 32)
    assert stand_in_driver == [("launch", ((1, 1, 1), 32, 0, nbytes))] * 2


@pytest.mark.skipif(not SIMULATOR, reason="on a GPU a compiled kernel has a handle")
def test_the_simulator_has_no_handle_and_raises_nothing():
    assert dynamic_smem.loaded_handle(_spec(60 * 1024, [])) is None
    assert dynamic_smem.raise_shared_limit(_spec(60 * 1024, [])) is False


# ---- the driver call, on stand-in handles (cuda.bindings' functions replaced: no driver here) --------------------
ATTRIBUTE = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
HANDLES = [  # (handle, the driver function that must be called, its expected arguments)
    (driver.CUkernel(7), "cuKernelSetAttribute", (ATTRIBUTE, 52224, driver.CUkernel(7), 3)),
    (driver.CUfunction(7), "cuFuncSetAttribute", (driver.CUfunction(7), ATTRIBUTE, 52224)),
]


@pytest.mark.parametrize("handle, function, expected", HANDLES, ids=["CUkernel", "CUfunction"])
def test_the_attribute_is_set_through_the_handles_own_driver_call(monkeypatch, handle, function, expected):
    calls = []
    for name in ("cuKernelSetAttribute", "cuFuncSetAttribute"):
        monkeypatch.setattr(driver, name, lambda *args, name=name: calls.append((name, args))
                            or (driver.CUresult.CUDA_SUCCESS,))
    dynamic_smem.set_max_dynamic_shared(handle, 3, 52224, "k")
    assert calls == [(function, expected)]


def test_a_refused_attribute_and_an_unknown_handle_say_what_to_do(monkeypatch):
    monkeypatch.setattr(driver, "cuKernelSetAttribute", lambda *args: (driver.CUresult.CUDA_ERROR_INVALID_VALUE,))
    with pytest.raises(RuntimeError, match=r"k: cuKernelSetAttribute\(MAX_DYNAMIC_SHARED_SIZE_BYTES, 300000\) on "
                                           r"device 0 failed .*give the kernel a smaller tile"):
        dynamic_smem.set_max_dynamic_shared(driver.CUkernel(1), 0, 300000, "k")
    with pytest.raises(TypeError, match="k: expected a CUkernel or CUfunction handle from numba-cuda, got int"):
        dynamic_smem.set_max_dynamic_shared(1, 0, 52224, "k")


# ---- the static check of the PTX tier and gpu_check --static: static + dynamic bytes per architecture -----------
SHARED_FITS = [  # (static bytes, dynamic bytes, cc, fits)
    (48 * 1024, 0, (9, 0), True),
    (48 * 1024 + 16, 0, (9, 0), False),          # static shared memory stops at 48 KB, whatever the attribute
    (0, 52224, (8, 0), True),
    (1024, 227 * 1024 - 1024, (9, 0), True),
    (1024, 227 * 1024 - 1024, (8, 0), False),    # sm_80 opts in to 163 KB per block
    (0, 227 * 1024 + 16, (9, 0), False),
]


@pytest.mark.parametrize("static, dynamic, cc, fits", SHARED_FITS)
def test_shared_fits_counts_static_and_dynamic_bytes_against_the_architecture(static, dynamic, cc, fits):
    assert shared_fits(static, dynamic, cc) is fits
    assert MAX_SHARED_PER_BLOCK == {(8, 0): 163 * 1024, (9, 0): 227 * 1024}
