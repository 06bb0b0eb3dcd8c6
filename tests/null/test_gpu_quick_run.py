"""``benchmarks.gpu.quick_run``'s order, isolation and budget with a stand-in runner (no GPU, no processes,
no wall clock): a crashed tile case excludes its tile from every later unit, a crashed step unit is
recorded and the next unit still runs, the warm-up writes the kernel cache that the later units only read,
and a unit the budget (a frozen clock the stand-in advances) no longer allows is recorded as not run."""
import json

import pytest

pytest.importorskip("numba", reason="the GPU check imports cuda_kernels, which needs numba")

from benchmarks.gpu import quick_run  # noqa: E402
from benchmarks.gpu.budget import Budget, FrozenClock  # noqa: E402
from benchmarks.gpu.isolate import UnitOutcome  # noqa: E402
from benchmarks.gpu.protocol import RecordWriter  # noqa: E402

SECONDS = {"compile_kernels": 30.0, "preflight_check": 3.0, "run_case": 3.0, "step_check": 40.0,
           "graph_vs_eager": 20.0, "step_timing": 0.0, "breakdown": 5.0}


class StandInRunner:
    def __init__(self, clock, step_timing_s):
        self.clock, self.calls = clock, []
        self.seconds = dict(SECONDS, step_timing=step_timing_s)

    def __call__(self, call, env):
        self.calls.append((call, dict(env)))
        self.clock.advance(self.seconds[call.function])
        if call.function == "run_case" and call.kwargs["name"] == "forward:128x128x32":
            return UnitOutcome(call.name, "crashed", 1.0, {}, "killed by SIGSEGV")
        if call.function == "step_check":
            return UnitOutcome(call.name, "crashed", 2.0, {}, "CudaAPIError: CUDA_ERROR_ILLEGAL_ADDRESS (stand-in)")
        result = {"ok": True, "seconds": {n: 1.0 for n in call.kwargs.get("names", [])}}
        if call.function == "step_timing":
            result["row"] = {"ours graph": {"seconds": 0.1, "replay": "graph"}, "torch eager": {"seconds": 0.2},
                             "torch.compile": {"error": "not tried"}}
        return UnitOutcome(call.name, "ok", 1.0, result)


def run(tmp_path, step_timing_s=100.0):
    clock = FrozenClock()
    runner = StandInRunner(clock, step_timing_s)
    out = RecordWriter(str(tmp_path / "q.jsonl"))
    failures, skipped, notes = [], [], []
    summary = quick_run.run_quick(out, Budget(480, clock=clock), failures, skipped, notes, runner=runner,
                                  env={"NUMBA_CACHE_DIR": str(tmp_path / "cache")})
    out.close()
    records = [json.loads(line) for line in (tmp_path / "q.jsonl").read_text().splitlines()]
    return records, runner.calls, failures, skipped, summary


def test_a_crashed_tile_is_excluded_from_every_later_unit_and_a_crashed_unit_does_not_stop_the_run(tmp_path):
    records, calls, failures, skipped, summary = run(tmp_path)
    assert [r["unit"] for r in records] == ["compile", "preflight", "tiles", "step-check resnet20",
                                            "graph-vs-eager resnet20", "step-timing resnet18-cifar",
                                            "torch.compile resnet18-cifar", "breakdown resnet18-cifar"]
    tiles = records[2]
    assert tiles["excluded_tiles"] == "forward:128x128x32" and tiles["cases"]["forward:128x128x32"]["status"] == \
        "crashed"
    steps = [(call, env) for call, env in calls if call.module == quick_run.UNITS and call.function not in
             ("compile_kernels", "preflight_check")]
    assert [call.function for call, _ in steps] == ["step_check", "graph_vs_eager", "step_timing", "breakdown"]
    assert all(env["BLUEPRINT_MMA_EXCLUDE"] == "forward:128x128x32" for _, env in steps)
    assert records[3]["status"] == "crashed" and "ILLEGAL_ADDRESS" in records[3]["error"]
    assert records[4]["status"] == "ok"
    assert any(f.startswith("tile forward:128x128x32: crashed") for f in failures)
    assert summary["ours_ips"] == pytest.approx(256 / 0.1)


def test_the_warm_up_writes_the_kernel_cache_and_every_later_unit_only_reads_it(tmp_path):
    _, calls, _, _, _ = run(tmp_path)
    cache = {call.function: env["BLUEPRINT_CUDA_CACHE"] for call, env in calls}
    assert cache.pop("compile_kernels") == "1" and set(cache.values()) == {"read"}
    assert {env["NUMBA_CACHE_DIR"] for _, env in calls} == {str(tmp_path / "cache")}
    compiled = [n for call, _ in calls if call.function == "compile_kernels" for n in call.kwargs["names"]]
    assert sorted(compiled) == quick_run.all_kernel_names()


def test_a_unit_the_budget_no_longer_allows_is_recorded_not_run(tmp_path):
    records, calls, _, skipped, _ = run(tmp_path, step_timing_s=480.0)   # the timing unit uses up the budget
    assert records[-1]["unit"] == "breakdown resnet18-cifar" and records[-1]["status"] == "not-run"
    assert "breakdown" not in [call.function for call, _ in calls]
    assert skipped and "NOT RUN" in skipped[-1]


def test_the_timing_unit_gets_the_time_left_and_tries_torch_compile_only_with_enough_of_it(tmp_path):
    _, calls, _, _, _ = run(tmp_path)
    timing = next(call for call, _ in calls if call.function == "step_timing")
    assert timing.kwargs["compile_torch"] and timing.kwargs["seconds_left"] == timing.timeout_s
    assert timing.timeout_s < 480 - 30 - 40 - 20


def test_warm_up_groups_spread_the_tensor_core_kernels_over_every_worker():
    groups = quick_run.warmup_groups(["a", "mma_1", "b", "mma_2", "mma_3"], 3)
    assert [g[0] for g in groups] == ["mma_1", "mma_2", "mma_3"] and sorted(sum(groups, [])) == \
        ["a", "b", "mma_1", "mma_2", "mma_3"]
