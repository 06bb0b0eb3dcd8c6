"""The ``--quick`` units as they run inside their own process (``isolate.run_isolated``): each takes plain
arguments and returns a JSON-able dict with ``ok``, what it measured, and the ``failures`` / ``skipped`` /
``notes`` lines the parent adds to the run's. The models are ``quick.QUICK_CHECK`` / ``QUICK_REPLAY`` /
``QUICK_TIMING`` (tests run the units in-process on a stand-in model)."""
import time

from . import quick
from .budget import Budget


def _lines():
    return [], [], []


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


def step_check():
    from cpu_ref import CpuExecutor
    from cuda_kernels import CudaExecutor
    from .steps import step_check_one
    failures, skipped, notes = _lines()
    result = step_check_one(quick.QUICK_CHECK, CpuExecutor, CudaExecutor, failures)
    worst = max([result.get("loss_error", float("inf"))] +
                [result[k]["worst"] for k in ("gradients", "updates", "BN stats") if k in result])
    return dict(result, ok=bool(result.get("ok")), max_err=worst, failures=failures, skipped=skipped, notes=notes)


def graph_vs_eager():
    from cuda_kernels import CudaExecutor
    from .steps import step_replay_one
    failures, skipped, notes = _lines()
    result = step_replay_one(quick.QUICK_REPLAY, CudaExecutor, failures)
    return dict(result, ok=bool(result.get("ok")), failures=failures, skipped=skipped, notes=notes)


def step_timing(seconds_left, compile_torch):
    """Ours eager and graph, PyTorch eager AMP, and torch.compile when ``seconds_left`` allow it."""
    from .timing import format_timing_table, step_timing as time_models
    failures, skipped, notes = _lines()
    rows = time_models([quick.QUICK_TIMING], Budget(seconds_left), failures, skipped, notes,
                       compile_torch=compile_torch)
    row = {k: v for k, v in rows.get(quick.QUICK_TIMING.name, {}).items() if k != "model"}
    print(format_timing_table(rows))
    return {"ok": not failures, "row": row, "failures": failures, "skipped": skipped, "notes": notes}


def breakdown():
    from cuda_kernels import CudaExecutor
    return dict(quick.gpu_breakdown(quick.QUICK_TIMING, CudaExecutor), ok=True)
