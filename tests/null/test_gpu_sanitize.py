"""The runbook's second command (``benchmarks.gpu.sanitize``): how a compute-sanitizer run becomes its record —
clean, hazards found, or the tool refused (on some machines it cannot attach). Canned tool output, no GPU."""
import pytest

pytest.importorskip("numba", reason="benchmarks.gpu imports cuda_kernels, which needs numba")

from benchmarks.gpu.sanitize import case_kernels, tool_record  # noqa: E402
from benchmarks.gpu.tile_cases import CASES  # noqa: E402

CLEAN = """case mma-forward: PASS ok
case forward:128x128x32: PASS max |error| 1.0e-03
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"""
RACE = """case forward:128x128x32: PASS max |error| 1.0e-03
========= Error: Race reported between Write access at mma_conv2d_forward_128x128x32+0x1a0
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)"""
REFUSED = """========= Error: Device not supported. Please refer to the "Supported Devices" section
========= Error: Target application terminated before first instrumented API call"""


def test_a_clean_run_is_ok_with_its_summary():
    record = tool_record("racecheck", 0, CLEAN, 12.0)
    assert record["status"] == "ok" and record["summary"] == ["RACECHECK SUMMARY: 0 hazards displayed (0 errors, "
                                                              "0 warnings)"]
    assert len(record["cases"]) == 2


def test_a_race_fails_the_record_and_names_the_hazard():
    record = tool_record("racecheck", 99, RACE, 12.0)
    assert record["status"] == "failed" and "mma_conv2d_forward_128x128x32" in record["hazards"][0]


def test_a_refused_device_is_recorded_as_refused():
    record = tool_record("memcheck", 255, REFUSED, 1.0)
    assert record["status"] == "refused" and "Device not supported" in record["refused"]


def test_the_warm_up_compiles_every_kernel_the_tile_cases_launch():
    assert len(case_kernels()) == len(CASES)
