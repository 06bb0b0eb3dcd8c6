"""Replaying a recorded step: eagerly, or as one CUDA graph captured with cuda.core.

``StepRunner(tape, mode)`` decides once how the step runs:
- ``"eager"``: ``tape.replay(stream)`` every step (one launch per kernel);
- ``"graph"``: the first ``run`` replays eagerly (the warm-up that compiles and loads
  every kernel, and a real step), synchronises, then captures the tape into a CUDA graph
  with a cuda.core ``GraphBuilder``; every later ``run`` is one ``graph.launch(stream)``.
The CUDA simulator has no graph API: there ``"graph"`` raises ``GraphUnavailable``
unless ``allow_eager_fallback=True``, which replays eagerly and says so
(``runner.fell_back``, ``runner.reason``). A capture that fails on a GPU ends the capture
(try/finally), warns once and falls back to eager replay the same way.

Streams: use ``new_stream()`` (a non-blocking cuda.core stream on a GPU; numba's default
stream cannot be used while capturing).
"""
from dataclasses import dataclass

from numba import cuda

from . import compat
from .registry import SIMULATOR

MODES = ("eager", "graph")


class GraphUnavailable(RuntimeError):
    pass


def graph_support():
    """``(available, reason)`` for CUDA graph capture in this process."""
    if SIMULATOR:
        return False, "the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) has no graph API"
    if not cuda.is_available():
        return False, "no CUDA GPU is available"
    feature = compat.FEATURES["graph-capture"]
    return feature.available, feature.why


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
    """A stream kernels can be launched on and captured from (numba's own where cuda.core cannot capture:
    eager replay needs no more)."""
    if SIMULATOR or not cuda.is_available() or not compat.FEATURES["graph-capture"].available:
        return cuda.stream()
    return compat.core_stream()


def synchronize(stream):
    stream.sync() if hasattr(stream, "sync") else stream.synchronize()


def new_graph_builder():
    """A cuda.core ``GraphBuilder`` on the current device (tests replace this to make capture fail)."""
    return compat.core_graph_builder()


def capture_graph(kernels):
    """Capture the launches ``kernels`` into one executable CUDA graph (kernels loaded already).

    The capture always ends: on any error while capturing, ``end_building`` is called before the
    error propagates, so the stream never stays in capture mode."""
    builder = new_graph_builder()
    builder.begin_building()
    ended = False
    try:
        with cuda.defer_cleanup():
            for entry in kernels:
                entry.run(builder)
        graph = builder.end_building()
        ended = True
        return graph.complete()
    finally:
        if not ended:
            try:
                builder.end_building()
            except Exception:   # the capture's own error is the one worth raising
                pass


class GraphCaptureWarning(RuntimeWarning):
    """Graph capture failed; the step is replayed eagerly (correct, slower)."""


class StepRunner:
    """Runs one recorded step on a stream: ``mode`` "eager" or "graph" (see the module header).

    The tape's transfers (uploads before the first kernel, downloads and events after the last)
    always run eagerly on the stream; graph mode captures the kernels between them. If the
    capture fails, the runner warns once (``GraphCaptureWarning``), replays eagerly from then
    on and says why: ``mode`` becomes "eager", ``fell_back`` True, ``reason`` the error."""

    def __init__(self, tape, mode="graph", allow_eager_fallback=False):
        plan = plan_replay(mode, allow_eager_fallback, graph_support())
        self.tape, self.mode, self.fell_back, self.reason = tape, plan.mode, plan.fell_back, plan.reason
        self.before, self.kernels, self.after = tape.segments()
        self.graph = None
        tape.compile_kernels()   # all compiles here, seen by fit()'s CompileWatch, none during the first step

    def run(self, stream):
        """One step on ``stream``; asynchronous except for the capture after the first graph-mode run."""
        if self.graph is None:
            self.tape.replay(stream)
            if self.mode == "graph":
                synchronize(stream)
                self._capture()
            return
        for entry in self.before:
            entry.run(stream)
        self.graph.launch(stream)
        for entry in self.after:
            entry.run(stream)

    def _capture(self):
        import warnings
        try:
            self.graph = capture_graph(self.kernels)
        except Exception as error:
            self.mode, self.fell_back = "eager", True
            self.reason = f"graph capture failed ({type(error).__name__}: {error}); replaying the tape eagerly"
            warnings.warn(f"StepRunner: {self.reason}", GraphCaptureWarning, stacklevel=3)
