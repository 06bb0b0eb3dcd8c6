"""``benchmarks.gpu.isolate``: every first launch runs in a spawned child with its own timeout; a unit that
crashes (an exception, ``os._exit``, a signal) or hangs ends that unit only, is recorded with why, and the
next unit runs in a fresh process. The units are stand-ins (tests/support/fake_units.py), no GPU."""
import os

import pytest

from benchmarks.gpu.isolate import UnitCall, outcome_of, run_isolated

FAKE = "tests.support.fake_units"


def call(function, timeout_s=120.0, **kwargs):
    return UnitCall(function, FAKE, function, kwargs, timeout_s)


def test_a_unit_that_returns_comes_back_with_its_result_from_another_process():
    outcome = run_isolated(call("returns", value=7))
    assert outcome.status == "ok" and outcome.result["value"] == 7
    assert outcome.result["pid"] != os.getpid()


def test_a_check_that_finds_a_difference_is_failed_not_crashed():
    outcome = run_isolated(call("finds_a_difference"))
    assert (outcome.status, outcome.error) == ("failed", "max |error| 3.0 > tolerance")


def test_an_exception_is_a_crash_with_its_error_and_traceback():
    outcome = run_isolated(call("raises"))
    assert outcome.status == "crashed"
    assert outcome.error == "RuntimeError: CUDA_ERROR_ILLEGAL_ADDRESS (stand-in)"
    assert any("fake_units.py" in line for line in outcome.result["traceback"])


@pytest.mark.parametrize("function, kwargs, why", [
    ("exits", {"status": 3}, "exited with status 3 without writing a result"),
    ("kills_itself", {"name": "SIGSEGV"}, "killed by SIGSEGV"),
    ("kills_itself", {"name": "SIGABRT"}, "killed by SIGABRT"),
])
def test_a_process_that_dies_is_a_crash_and_the_next_unit_runs_in_a_fresh_process(function, kwargs, why):
    outcome = run_isolated(call(function, **kwargs))
    assert (outcome.status, outcome.error) == ("crashed", why)
    after = run_isolated(call("returns", value=1))
    assert after.status == "ok"


def test_a_unit_that_hangs_is_killed_at_its_timeout_and_the_next_one_runs():
    outcome = run_isolated(call("hangs", timeout_s=3.0))   # it never returns: the outcome cannot depend on speed
    assert outcome.status == "timeout" and "3 s timeout" in outcome.error
    assert run_isolated(call("returns", value=2)).result["value"] == 2


def test_outcomes_from_exits_and_written_results():
    unit = UnitCall("u", FAKE, "returns", {}, 5.0)
    assert outcome_of(unit, 0, False, {"result": {"x": 1}}, 1.0).status == "ok"
    assert outcome_of(unit, 0, False, {"result": [1]}, 1.0).error == "returned list, expected a dict"
    assert outcome_of(unit, -9, True, None, 5.0).status == "timeout"
    assert outcome_of(unit, 0, False, None, 1.0).error == "exited with status 0 without writing a result"
    assert outcome_of(unit, -11, False, {"result": {}}, 1.0).error == "killed by SIGSEGV"


def test_units_run_side_by_side_each_in_its_own_process_and_come_back_in_order():
    from benchmarks.gpu.isolate import run_many
    outcomes = run_many([call("returns", value=v) for v in range(3)] + [call("exits", status=4)], parallel=3)
    assert [o.result.get("value") for o in outcomes] == [0, 1, 2, None]
    assert len({o.result["pid"] for o in outcomes[:3]}) == 3 and outcomes[3].status == "crashed"


def test_in_process_units_report_as_isolated_ones_do():
    from benchmarks.gpu.isolate import run_in_process
    assert run_in_process(call("returns", value=5)).result["value"] == 5
    assert run_in_process(call("raises")).error == "RuntimeError: CUDA_ERROR_ILLEGAL_ADDRESS (stand-in)"
    assert run_in_process(call("finds_a_difference")).status == "failed"


def test_numpy_values_come_back_as_numbers():
    outcome = run_isolated(call("returns_numpy"))
    assert outcome.status == "ok" and outcome.result == {"error": 0.5, "shape": [2, 3], "ok": True}
