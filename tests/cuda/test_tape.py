"""The arena, the launch tape's argument checks and the replay-mode decision."""
import numpy as np
import pytest
from numba import cuda

from cuda_kernels import _elementwise
from cuda_kernels._arena import ALIGNMENT, DeviceArena
from cuda_kernels._graph import GraphUnavailable, StepRunner, graph_support, new_stream, plan_replay, synchronize
from cuda_kernels._registry import SIMULATOR
from cuda_kernels._tape import Immediate, LaunchTape


def test_arena_views_alias_one_buffer():
    arena = DeviceArena(1000)
    assert arena.nbytes == 1024
    stream = new_stream()
    arena.zero(Immediate(stream))          # every operation on one stream: ordered without a device sync
    a = arena.view(256, (2, 3), np.float16)
    b = arena.view(256, 6, np.float16)
    arena.upload(256, np.arange(6, dtype=np.float16).reshape(2, 3), stream)
    synchronize(stream)
    np.testing.assert_array_equal(b.copy_to_host(stream=stream), np.arange(6, dtype=np.float16))
    np.testing.assert_array_equal(a.copy_to_host(stream=stream), np.arange(6, dtype=np.float16).reshape(2, 3))
    np.testing.assert_array_equal(arena.download(0, 256, np.uint8, stream), 0)   # nothing outside the slot moved
    arena.zero(Immediate(stream))
    np.testing.assert_array_equal(arena.download(256, 6, np.float16, stream), 0)


def test_arena_rejects_misaligned_and_out_of_range_slices():
    arena = DeviceArena(512)
    with pytest.raises(ValueError, match="not a multiple of 256"):
        arena.view(128, 4, np.float32)
    with pytest.raises(ValueError, match="leave the arena"):
        arena.view(256, 65, np.float32)
    with pytest.raises(ValueError, match="leave the arena"):
        arena.upload(ALIGNMENT, np.zeros(300, np.uint8), 0)


def test_tape_rejects_host_arrays_and_wrong_scalar_types():
    tape = LaunchTape()
    y = cuda.device_array(8, np.float16)
    with pytest.raises(TypeError, match="host numpy array"):
        _elementwise.activation_forward(tape, 0, np.zeros(8, np.float16), y)
    spec = _elementwise._activation_forward
    with pytest.raises(TypeError, match="'code' expects int32, got int64"):
        tape.launch(spec, 1, 32, cuda.device_array(8, np.float16), y, 3, np.float32(0.1))
    with pytest.raises(TypeError, match="expects 4 arguments"):
        Immediate().launch(spec, 1, 32, y, y)
    assert len(tape) == 0


def test_tape_replays_in_order():
    x = cuda.to_device(np.array([-1, 2, -3, 4], np.float16))
    y, z = cuda.device_array(4, np.float16), cuda.device_array(4, np.float16)
    tape = LaunchTape()
    _elementwise.activation_forward(tape, 0, x, y)       # relu
    _elementwise.add_forward(tape, y, x, z)              # relu(x) + x
    assert tape.names() == ["activation_forward", "add_forward"]
    assert [s.name for s in tape.kernel_specs()] == ["activation_forward", "add_forward"]
    tape.replay()
    np.testing.assert_array_equal(z.copy_to_host(), [-1, 4, -3, 8])


@pytest.mark.parametrize("requested, fallback, support, expected", [
    ("eager", False, (False, "none"), ("eager", False)),
    ("eager", False, (True, ""), ("eager", False)),
    ("graph", False, (True, ""), ("graph", False)),
    ("graph", True, (True, ""), ("graph", False)),
    ("graph", True, (False, "no GPU"), ("eager", True)),
])
def test_plan_replay(requested, fallback, support, expected):
    plan = plan_replay(requested, fallback, support)
    assert (plan.mode, plan.fell_back) == expected
    assert (plan.reason != "") == plan.fell_back
    if plan.fell_back:
        assert support[1] in plan.reason


def test_plan_replay_refuses_a_silent_fallback():
    with pytest.raises(GraphUnavailable, match="no GPU.*allow_eager_fallback=True"):
        plan_replay("graph", False, (False, "no GPU"))
    with pytest.raises(ValueError, match="mode must be one of"):
        plan_replay("cuda-graph", False, (True, ""))


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's lack of graphs is what is tested")
def test_simulator_graph_mode_raises_or_falls_back_explicitly():
    assert graph_support() == (False, "the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) has no graph API")
    x = cuda.to_device(np.array([1, 2], np.float16))
    tape = LaunchTape()
    _elementwise.accumulate_into(tape, x, x, True)
    with pytest.raises(GraphUnavailable, match="simulator"):
        StepRunner(tape, "graph")
    runner = StepRunner(tape, "graph", allow_eager_fallback=True)
    assert runner.mode == "eager" and runner.fell_back and "simulator" in runner.reason
    stream = new_stream()
    runner.run(stream)
    runner.run(stream)
    synchronize(stream)
    np.testing.assert_array_equal(x.copy_to_host(), [4, 8])
