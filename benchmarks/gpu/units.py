"""The units of a GPU run as they run inside their own process (``isolate.run_isolated``), for ``--quick``
(quick_run.py) and the full run (full_run.py): each takes plain arguments and returns a JSON-able dict with
``ok``, what it measured, and the ``failures`` / ``skipped`` / ``notes`` lines the parent adds to the run's.
A step unit's ``model`` names a model of its section (``step_common.SECTION_MODELS``); without it, the
``--quick`` model (``quick.QUICK_CHECK`` / ``QUICK_REPLAY`` / ``QUICK_TIMING``, read when the unit runs: tests
run the units in-process on a stand-in model)."""
import time

from . import quick
from .budget import Budget

QUICK_MODELS = {"step-check": "QUICK_CHECK", "step-replay": "QUICK_REPLAY", "step-timing": "QUICK_TIMING"}


def _lines():
    return [], [], []


def _model(section, name):
    """The model ``name`` of ``section``; None: the ``--quick`` run's."""
    from .step_common import SECTION_MODELS
    if name is None:
        return getattr(quick, QUICK_MODELS[section])
    found = [m for m in SECTION_MODELS[section] if m.name == name]
    if not found:
        raise KeyError(f"{section} has no model {name!r}; its models: {[m.name for m in SECTION_MODELS[section]]}")
    return found[0]


def compile_kernels(names):
    """JIT-compile the kernels ``names`` (the table's and the tensor-core table's) for this GPU; with
    ``BLUEPRINT_CUDA_CACHE=1`` each lands in the disk cache, where the later units load it."""
    from cuda_kernels.mma_kernels import all_mma_kernels
    from cuda_kernels.registry import all_kernels
    table = {**all_kernels(), **all_mma_kernels()}
    seconds = {}
    for name in names:
        started = time.perf_counter()
        table[name].compile()
        seconds[name] = round(time.perf_counter() - started, 3)
    return {"ok": True, "seconds": seconds, "total_s": round(sum(seconds.values()), 3)}


def preflight_check(name):
    """One check of ``preflight.CHECKS`` on a fresh stream (the stream check first, inside this process)."""
    from .preflight import CHECKS, run_check, stream_check
    made = {}
    results = [run_check(stream_check(made), 0)]
    if results[0]["status"] != "FAIL":
        results.append(run_check(next(c for c in CHECKS if c.name == name), made["stream"]))
    result = results[-1]
    failed = [r for r in results if r["status"] == "FAIL"]
    return dict(result, ok=not failed, error=failed[0]["error"] if failed else "")


def kernel_row(name):
    """One row of ``kernel_cases.table``: cross-checked against the numpy spec at ``CHECK_BATCH``, then timed
    at ``TIMING_BATCH`` (eager tape replay, events on one stream)."""
    from cuda_kernels.graph import new_stream
    from .kernel_cases import CHECK_BATCH, TIMING_BATCH, table
    from .kernels import cross_check, timing_table
    stream = new_stream()
    failures = cross_check({name: table(CHECK_BATCH)[name]}, stream)
    timing, = timing_table({name: table(TIMING_BATCH)[name]}, stream)
    return {"ok": not failures, "error": "; ".join(failures), "failures": failures, "timing": timing}


def hand_made_graph():
    """Graph-vs-eager replay of a hand-made tape of many small launches (``kernels.graph_check``)."""
    from cuda_kernels.graph import new_stream
    from .kernels import graph_check
    eager_us, graph_us, launches, failures = graph_check(new_stream())
    print(f"graph vs eager, {launches} launches per step: eager {eager_us:.1f} us, graph {graph_us:.1f} us")
    return {"ok": not failures, "eager_us": eager_us, "graph_us": graph_us, "launches": launches,
            "failures": failures}


def step_check(model=None):
    from cpu_ref import CpuExecutor
    from cuda_kernels import CudaExecutor
    from .steps import step_check_one
    failures, skipped, notes = _lines()
    result = step_check_one(_model("step-check", model), CpuExecutor, CudaExecutor, failures)
    worst = max([result.get("loss_error", float("inf"))] +
                [result[k]["worst"] for k in ("gradients", "updates", "BN stats") if k in result])
    return dict(result, ok=bool(result.get("ok")), max_err=worst, failures=failures, skipped=skipped, notes=notes)


def graph_vs_eager(model=None):
    from cuda_kernels import CudaExecutor
    from .steps import step_replay_one
    failures, skipped, notes = _lines()
    result = step_replay_one(_model("step-replay", model), CudaExecutor, failures)
    return dict(result, ok=bool(result.get("ok")), failures=failures, skipped=skipped, notes=notes)


def step_timing(seconds_left, compile_torch, model=None):
    """Ours eager and graph, PyTorch eager AMP, and torch.compile when ``compile_torch`` and ``seconds_left``
    allow it."""
    from .timing import format_timing_table, step_timing as time_models
    failures, skipped, notes = _lines()
    chosen = _model("step-timing", model)
    rows = time_models([chosen], Budget(seconds_left), failures, skipped, notes, compile_torch=compile_torch)
    row = {k: v for k, v in rows.get(chosen.name, {}).items() if k != "model"}
    print(format_timing_table(rows))
    return {"ok": not failures, "row": row, "failures": failures, "skipped": skipped, "notes": notes}


def torch_compile(seconds_left, model):
    """torch.compile's column of one timed model; where it cannot run, a note says why (it only adds a column)."""
    from .timing import torch_compile_column
    failures, skipped, notes = _lines()
    chosen = _model("step-timing", model)
    rows = {chosen.name: {"model": chosen}}
    torch_compile_column(rows, Budget(seconds_left), notes)
    return dict(rows[chosen.name]["torch.compile"], ok=True, failures=failures, skipped=skipped, notes=notes)


def breakdown(model=None):
    from cuda_kernels import CudaExecutor
    return dict(quick.gpu_breakdown(_model("step-timing", model), CudaExecutor), ok=True)
