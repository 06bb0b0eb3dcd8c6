"""``benchmarks.gpu.full_run`` (the check without ``--quick``) with a stand-in runner (no GPU, no processes, no
wall clock): every preflight check, tile case, kernel row, step model, torch.compile and data-parallel run goes
through the runner (a process of its own on a GPU), in order; a crashed or timed-out unit is recorded with why
and the next unit runs; ``--only`` still selects rows, sections and models."""
import json

import pytest

pytest.importorskip("numba", reason="the GPU check imports cuda_kernels, which needs numba")

from benchmarks.gpu import ddp, full_run, quick_run  # noqa: E402
from benchmarks.gpu.budget import Budget, FrozenClock  # noqa: E402
from benchmarks.gpu.isolate import UnitOutcome  # noqa: E402
from benchmarks.gpu.kernel_cases import CHECK_BATCH, table  # noqa: E402
from benchmarks.gpu.preflight import CHECKS  # noqa: E402
from benchmarks.gpu.protocol import RecordWriter  # noqa: E402
from benchmarks.gpu.step_common import CHECK_MODELS, REPLAY_MODELS, TIMING_MODELS  # noqa: E402
from benchmarks.gpu.tile_cases import CASES  # noqa: E402

ROWS = list(table(CHECK_BATCH))
CRASHING_ROW, HANGING_MODEL = ROWS[1], CHECK_MODELS[1].name
RESULTS = {   # what each unit returns (the stand-in's), by function
    "kernel_row": lambda call: {"timing": {"row": call.kwargs["name"], "us": 10.0, "tflops": 1.0, "gbs": 1.0,
                                           "launches": 1}},
    "step_check": lambda call: {"max_err": 1e-3},
    "step_timing": lambda call: {"row": {"ours graph": {"seconds": 0.1, "replay": "graph", "launches": 9,
                                                        "graph": True},
                                         "torch eager": {"seconds": 0.2, "peak_bytes": 2.0 ** 20},
                                         "arena_bytes": 2.0 ** 20}},
    "torch_compile": lambda call: {"seconds": 0.05, "peak_bytes": 2.0 ** 20},
    "train": lambda call: {"images_per_second": 1000.0 * call.kwargs["processes"]},
}


class StandInRunner:
    def __init__(self, clock):
        self.clock, self.calls = clock, []

    def __call__(self, call, env):
        self.calls.append(call)
        self.clock.advance(1.0)
        if call.kwargs.get("name") == CRASHING_ROW:
            return UnitOutcome(call.name, "crashed", 1.0, {}, "killed by SIGSEGV")
        if call.function == "step_check" and call.kwargs["model"] == HANGING_MODEL:
            return UnitOutcome(call.name, "timeout", call.timeout_s, {}, "ran past its 240 s timeout")
        result = {"ok": True, "seconds": {n: 1.0 for n in call.kwargs.get("names", [])}}
        result.update(RESULTS.get(call.function, lambda call: {})(call))
        return UnitOutcome(call.name, "ok", 1.0, result)


def run(tmp_path, monkeypatch, only=""):
    monkeypatch.setattr(ddp, "gpu_count", lambda: 2)
    clock = FrozenClock()
    runner = StandInRunner(clock)
    out = RecordWriter(str(tmp_path / "f.jsonl"))
    failures, skipped, notes = [], [], []
    summary = full_run.run_full(out, only, Budget(10_000, clock=clock), failures, skipped, notes, runner=runner,
                                env={"NUMBA_CACHE_DIR": str(tmp_path / "cache")})
    out.close()
    records = [json.loads(line) for line in (tmp_path / "f.jsonl").read_text().splitlines()]
    return records, runner.calls, failures, summary


def test_every_unit_of_the_full_run_goes_through_the_runner_in_order(tmp_path, monkeypatch):
    records, calls, failures, summary = run(tmp_path, monkeypatch)
    units = [c.name for c in calls if c.function != "compile_kernels"]
    assert units == ([f"preflight {c.name}" for c in CHECKS] + [f"tile {name}" for name in CASES]
                     + [f"kernel {name}" for name in ROWS] + ["graph-vs-eager (hand-made tape)"]
                     + [f"step-check {m.name}" for m in CHECK_MODELS] + [f"step-replay {m.name}" for m in REPLAY_MODELS]
                     + [f"step-timing {m.name}" for m in TIMING_MODELS] + [f"torch.compile {m.name}" for m in TIMING_MODELS]
                     + [f"data-parallel {label}" for label in ddp.RUNS])
    assert sorted(n for c in calls if c.function == "compile_kernels" for n in c.kwargs["names"]) == \
        quick_run.all_kernel_names()
    # every unit that ran has its record, in the same order, after the warm-up's, the preflight's and the tiles'
    assert [r["unit"] for r in records] == ["compile", "preflight", "tiles"] + units[len(CHECKS) + len(CASES):]
    assert summary["max_err"] == 1e-3 and summary["ours_ips"] == pytest.approx(256 / 0.1)


def test_a_crashed_or_timed_out_unit_is_recorded_with_why_and_the_next_unit_runs(tmp_path, monkeypatch):
    records, calls, failures, _ = run(tmp_path, monkeypatch)
    by_unit = {r["unit"]: r for r in records}
    crashed, after = by_unit[f"kernel {CRASHING_ROW}"], by_unit[f"kernel {ROWS[2]}"]
    assert (crashed["status"], crashed["error"]) == ("crashed", "killed by SIGSEGV") and after["status"] == "ok"
    hung = by_unit[f"step-check {HANGING_MODEL}"]
    assert hung["status"] == "timeout" and "timeout" in hung["error"]
    assert by_unit[f"step-check {CHECK_MODELS[2].name}"]["status"] == "ok"
    assert f"kernel {CRASHING_ROW}: crashed: killed by SIGSEGV" in failures
    assert any(f.startswith(f"step-check {HANGING_MODEL}: timeout") for f in failures)
    assert {r["excluded_tiles"] for r in records if r["unit"].startswith(("kernel ", "step-"))} == {""}


@pytest.mark.parametrize("only, expected", [
    ("conv3x3-64 ", [f"kernel {n}" for n in ROWS if "conv3x3-64 " in n]),
    ("resnet50", ["step-check resnet50@128", "step-timing resnet50", "torch.compile resnet50"]),
    ("data-parallel", [f"data-parallel {label}" for label in ddp.RUNS]),
])
def test_only_selects_rows_sections_and_models_and_the_checks_always_run(tmp_path, monkeypatch, only, expected):
    _, calls, _, _ = run(tmp_path, monkeypatch, only)
    units = [c.name for c in calls if c.function not in ("compile_kernels", "preflight_check", "run_case")]
    assert units == expected
    assert len([c for c in calls if c.function in ("preflight_check", "run_case")]) == len(CHECKS) + len(CASES)
