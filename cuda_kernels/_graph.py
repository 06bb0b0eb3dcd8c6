"""Replaying a recorded step: eagerly, or as one CUDA graph captured with cuda.core.

``StepRunner(tape, mode)`` decides once how the step runs:
- ``"eager"``: ``tape.replay(stream)`` every step (one launch per kernel);
- ``"graph"``: the first ``run`` replays eagerly (the warm-up that compiles and loads
  every kernel, and a real step), synchronises, then captures the tape into a CUDA graph
  with a cuda.core ``GraphBuilder``; every later ``run`` is one ``graph.launch(stream)``.
The CUDA simulator has no graph API: there ``"graph"`` raises ``GraphUnavailable``
unless ``allow_eager_fallback=True``, which replays eagerly and says so
(``runner.fell_back``, ``runner.reason``).

Streams: use ``new_stream()`` (a non-blocking cuda.core stream on a GPU; numba's default
stream cannot be used while capturing).
"""
from dataclasses import dataclass

from numba import cuda

from ._registry import SIMULATOR

MODES = ("eager", "graph")


class GraphUnavailable(RuntimeError):
    pass


def graph_support():
    """``(available, reason)`` for CUDA graph capture in this process."""
    if SIMULATOR:
        return False, "the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) has no graph API"
    if not cuda.is_available():
        return False, "no CUDA GPU is available"
    try:
        from cuda.core import Device  # noqa: F401
        from cuda.core.graph import GraphBuilder  # noqa: F401
    except ImportError as error:
        return False, f"cuda.core graph API unavailable ({error}); install cuda-core>=1.0"
    return True, ""


@dataclass(frozen=True)
class ReplayPlan:
    mode: str            # what runs: "eager" or "graph"
    fell_back: bool      # "graph" was asked for but "eager" runs
    reason: str


def plan_replay(requested, allow_eager_fallback, support):
    """Decide the replay mode from the request and ``support = graph_support()``."""
    if requested not in MODES:
        raise ValueError(f"StepRunner: mode must be one of {MODES}, got {requested!r}")
    available, why = support
    if requested == "eager" or available:
        return ReplayPlan(requested, False, "")
    if allow_eager_fallback:
        return ReplayPlan("eager", True, f"graph replay unavailable: {why}; replaying the tape eagerly")
    raise GraphUnavailable(f"StepRunner: graph replay unavailable: {why}. Use mode='eager', "
                           f"or allow_eager_fallback=True to replay eagerly instead")


def new_stream():
    """A stream kernels can be launched on and captured from."""
    if SIMULATOR or not cuda.is_available():
        return cuda.stream()
    from cuda.core import Device
    device = Device()
    device.set_current()
    return device.create_stream()


def synchronize(stream):
    stream.sync() if hasattr(stream, "sync") else stream.synchronize()


def capture_graph(tape):
    """Capture every launch of ``tape`` into one executable CUDA graph (kernels loaded already)."""
    from cuda.core import Device
    device = Device()
    device.set_current()
    builder = device.create_graph_builder()
    builder.begin_building()
    with cuda.defer_cleanup():
        for entry in tape:
            entry.run(builder)
    return builder.end_building().complete()


class StepRunner:
    def __init__(self, tape, mode="graph", allow_eager_fallback=False):
        plan = plan_replay(mode, allow_eager_fallback, graph_support())
        self.tape, self.mode, self.fell_back, self.reason = tape, plan.mode, plan.fell_back, plan.reason
        self.graph = None

    def run(self, stream):
        """One step on ``stream``; asynchronous except for the capture after the first graph-mode run."""
        if self.graph is not None:
            self.graph.launch(stream)
            return
        self.tape.replay(stream)
        if self.mode == "graph":
            synchronize(stream)
            self.graph = capture_graph(self.tape)
