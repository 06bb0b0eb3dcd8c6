"""The arena, the launch tape's argument checks, the replay-mode decision, and graph capture's failure path."""
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from numba import cuda

from cuda_kernels import elementwise, graph
from cuda_kernels.arena import ALIGNMENT, DeviceArena
from cuda_kernels.graph import (GraphCaptureWarning, GraphUnavailable, StepRunner, graph_support, new_stream,
                                 plan_replay, synchronize)
from cuda_kernels.registry import SIMULATOR
from cuda_kernels.tape import Immediate, Launch, LaunchTape
from cuda_kernels.vector import one_element_name
from planner.ops import Prim


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
        elementwise.activation_forward(tape, Prim.RELU, np.zeros(8, np.float16), y)
    spec = elementwise.ACTIVATION_KERNELS[Prim.RELU].forward
    with pytest.raises(TypeError, match="'a' expects float32, got float64"):
        tape.launch(spec, 1, 32, cuda.device_array(8, np.float16), y, 0.1, np.float32(0))
    with pytest.raises(TypeError, match="expects 4 arguments"):
        Immediate().launch(spec, 1, 32, y, y)
    assert len(tape) == 0


def test_tape_replays_in_order():
    x = cuda.to_device(np.array([-1, 2, -3, 4], np.float16))
    y, z = cuda.device_array(4, np.float16), cuda.device_array(4, np.float16)
    tape = LaunchTape()
    elementwise.activation_forward(tape, Prim.RELU, x, y)
    elementwise.add_forward(tape, y, x, z)              # relu(x) + x
    assert tape.names() == ["activation_forward.relu", "add_forward"]
    assert [s.name for s in tape.kernel_specs()] == ["activation_forward.relu", "add_forward"]
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
    elementwise.accumulate_into(tape, x, x, True)
    with pytest.raises(GraphUnavailable, match="simulator"):
        StepRunner(tape, "graph")
    runner = StepRunner(tape, "graph", allow_eager_fallback=True)
    assert runner.mode == "eager" and runner.fell_back and "simulator" in runner.reason
    stream = new_stream()
    runner.run(stream)
    runner.run(stream)
    synchronize(stream)
    np.testing.assert_array_equal(x.copy_to_host(), [4, 8])


# ---- a failing capture (item 3 of issue 11): monkeypatched so that capture raises in the simulator ----------
class FakeBuilder:
    """Stands in for cuda.core's GraphBuilder: records begin/end; ``fail_at`` says where capture raises."""

    def __init__(self, fail_at):
        self.fail_at, self.calls = fail_at, []

    def begin_building(self):
        self.calls.append("begin")

    def end_building(self):
        self.calls.append("end")
        return SimpleNamespace(complete=self._complete)

    def _complete(self):
        if self.fail_at == "complete":
            raise RuntimeError("instantiation refused (test)")
        raise AssertionError("the test builder never completes a graph")


@pytest.mark.parametrize("fail_at", ["second launch", "complete"])
def test_a_failing_capture_ends_it_warns_once_and_replays_eagerly(monkeypatch, fail_at):
    builders = []

    def new_builder():
        builders.append(FakeBuilder(fail_at))
        return builders[-1]

    launches_into_builder = []
    run = Launch.run

    def run_or_refuse(self, stream):
        if isinstance(stream, FakeBuilder):
            launches_into_builder.append(self.name)
            if fail_at == "second launch" and len(launches_into_builder) == 2:
                raise RuntimeError("capture refused (test)")
            return None     # captured, not run
        return run(self, stream)

    monkeypatch.setattr(graph, "graph_support", lambda: (True, ""))
    monkeypatch.setattr(graph, "new_graph_builder", new_builder)
    monkeypatch.setattr(Launch, "run", run_or_refuse)
    x = cuda.to_device(np.array([1, 2], np.float16))
    tape = LaunchTape()
    elementwise.accumulate_into(tape, x, x, True)      # x += x
    elementwise.accumulate_into(tape, x, x, True)
    runner, stream = StepRunner(tape, "graph"), new_stream()
    assert runner.mode == "graph"
    with pytest.warns(GraphCaptureWarning, match="refused") as caught:
        runner.run(stream)                              # the eager warm-up step, then the capture fails
    assert len([w for w in caught if issubclass(w.category, GraphCaptureWarning)]) == 1
    assert [b.calls for b in builders] == [["begin", "end"]], "the capture must end exactly once"
    assert runner.mode == "eager" and runner.fell_back and runner.graph is None
    assert "graph capture failed" in runner.reason and "refused" in runner.reason
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # no second warning
        runner.run(stream)
    synchronize(stream)
    assert len(builders) == 1, "no second capture attempt"
    np.testing.assert_array_equal(x.copy_to_host(stream=stream), [16, 32])   # two eager steps of x *= 4


def test_graph_replay_issues_the_transfers_around_the_graph_launch(monkeypatch):
    """Graph mode captures the kernels only; uploads before and downloads after run on the stream."""
    from cuda_kernels.transfer import Staging, record_transfers
    x, y = cuda.device_array(2, np.float16), cuda.device_array(2, np.float16)
    staging = Staging({"x": x}, {"y": y})
    tape = LaunchTape()
    record_transfers(tape, staging, lambda t: elementwise.activation_forward(t, Prim.RELU, x, y))
    before, kernels, after = tape.segments()
    assert [e.kind for e in before] == ["upload", "event"] and [e.kind for e in kernels] == ["kernel"]
    assert [(e.kind, e.name) for e in after] == [("download", "y"), ("event", "done")]
    launched = []
    monkeypatch.setattr(graph, "graph_support", lambda: (True, ""))
    monkeypatch.setattr(graph, "capture_graph", lambda body: SimpleNamespace(
        launch=lambda stream: [entry.run(stream) for entry in body] and launched.append(len(body))))
    runner, stream = StepRunner(tape, "graph"), new_stream()
    staging.trace = []
    for value in ([-1, 2], [3, -4]):
        turn = staging.begin({"x": np.array(value, np.float32)})
        runner.run(stream)
        np.testing.assert_array_equal(staging.result(turn)["y"], np.maximum(value, 0))
    assert launched == [1], "the second step is one graph launch"
    assert staging.trace[-7:] == [("host_wait", "uploaded"), ("upload", "x"), ("event", "uploaded"),
                                  ("download", "y"), ("event", "done"), ("host_wait", "done"), ("host_read", "y")]


def test_merged_zero_fills_keep_every_fill_after_the_last_launch_that_uses_its_bytes():
    """``coalesce_zero_fills``: a fill moves back only past launches that do not touch its bytes, and fills that
    meet become one multi-range launch. Here the fill of ``b`` must stay after the cast that reads ``b`` (else
    ``c`` would hold zeros), while the fills of ``a`` and ``e`` join one launch at the start."""
    arena = DeviceArena(2048)
    stream = new_stream()
    a, b, e = (arena.view(off, 16, np.float32) for off in (0, 256, 512))
    c, d = arena.view(768, 16, np.float16), arena.view(1024, 16, np.float16)
    values = np.arange(1, 17, dtype=np.float32)
    for off in (0, 256, 512):
        arena.upload(off, values, stream)
    tape = LaunchTape()
    elementwise.cast_f32_to_f16(tape, b, c)    # reads b
    elementwise.fill_zero(tape, a)             # nothing used a before: to the start
    elementwise.fill_zero(tape, b)             # after the cast that reads b
    elementwise.cast_f32_to_f16(tape, a, d)    # reads the zeroed a
    elementwise.fill_zero(tape, e)             # untouched: joins a's fill
    tape.coalesce_zero_fills(arena.buffer)
    names = [one_element_name(name) for name in tape.names()]   # the cast runs its 16-byte twin where it can
    assert names == ["fill_zero_ranges", "cast_f32_to_f16", "fill_zero_ranges", "cast_f32_to_f16"]
    tape.replay(stream)
    synchronize(stream)
    np.testing.assert_array_equal(arena.download(768, 16, np.float16, stream), values.astype(np.float16))
    for off, dtype in ((0, np.float32), (256, np.float32), (512, np.float32), (1024, np.float16)):
        np.testing.assert_array_equal(arena.download(off, 16, dtype, stream), 0)
