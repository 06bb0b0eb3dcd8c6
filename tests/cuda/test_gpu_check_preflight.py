"""`benchmarks.gpu.check`'s first-run safety, in the simulator with stand-ins for what only a GPU has: the preflight
(``benchmarks.gpu.preflight``: each GPU-only assumption tried alone, PASS / FAIL / SKIP with the error), a crashed
unit's traceback in its record, and a time limit's SIGTERM recorded as "interrupted" with the summary."""
import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from cuda.bindings import driver
from numba import cuda


from benchmarks.gpu import preflight as gpu_preflight
from benchmarks.gpu.preflight import CHECKS, Check, preflight
from benchmarks.gpu.protocol import Interrupted, RecordWriter, Unit, interrupt_on_sigterm
from cuda_kernels import dynamic_smem, graph

ATTRIBUTE = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]   # the simulator's dropout hash


def _records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture
def gpu_stand_ins(monkeypatch):
    """What a GPU has and the simulator lacks: a loaded kernel's handle, its attribute in the driver, a
    non-blocking stream, graph capture (a stand-in "graph" that replays the captured launches). Returns the
    driver calls made, ``[(function, args)]``, and the attribute's stored value."""
    calls, stored = [], {}

    def set_attribute(attribute, value, kernel, device):
        calls.append(("cuKernelSetAttribute", (attribute, value, kernel, device)))
        stored[int(kernel), device] = value
        return (driver.CUresult.CUDA_SUCCESS,)

    def get_attribute(attribute, kernel, device):
        calls.append(("cuKernelGetAttribute", (attribute, kernel, device)))
        return driver.CUresult.CUDA_SUCCESS, stored.get((int(kernel), device), 48 * 1024)

    def capture(kernels):
        return SimpleNamespace(launch=lambda stream: [entry.run(stream) for entry in kernels])

    def stream():
        made = cuda.stream()
        made.is_nonblocking = True
        return made
    monkeypatch.setattr(gpu_preflight, "SIMULATOR", False)
    monkeypatch.setattr(gpu_preflight, "device_optin_shared", lambda: ((9, 0), 227 * 1024))   # an H100 / H200
    monkeypatch.setattr(dynamic_smem, "_RAISED", {})
    monkeypatch.setattr(dynamic_smem, "loaded_handle", lambda spec: (driver.CUkernel(0x5a), 0))
    monkeypatch.setattr(driver, "cuKernelSetAttribute", set_attribute)
    monkeypatch.setattr(driver, "cuKernelGetAttribute", get_attribute)
    monkeypatch.setattr(graph, "graph_support", lambda: (True, ""))
    monkeypatch.setattr(graph, "capture_graph", capture)
    monkeypatch.setattr(graph, "new_stream", stream)
    return calls, stored


def test_every_preflight_check_passes_on_the_stand_ins_and_the_kernels_equal_numpy(tmp_path, gpu_stand_ins):
    calls, _ = gpu_stand_ins
    out, failures = RecordWriter(str(tmp_path / "p.jsonl")), []
    preflight(out, failures)
    out.close()
    (record,) = _records(tmp_path / "p.jsonl")
    assert record["unit"] == "preflight" and record["status"] == "ok" and failures == []
    checks = {c["name"]: c for c in record["checks"]}
    assert list(checks) == ["stream", "handle", "shared-limit", "mma-forward", "mma-dynamic", "graph"]
    assert all(c["status"] == "PASS" for c in checks.values()), checks
    wide = gpu_preflight._wide_dgrad_spec()
    assert checks["handle"]["detail"] == f"{wide.name}: CUkernel 0x5a on device 0"
    assert checks["shared-limit"]["detail"] == (f"{wide.name}: MAX_DYNAMIC_SHARED_SIZE_BYTES = "
                                                f"{wide.dynamic_shared_bytes} (read back); sm_90 opts in to 232448 "
                                                f"bytes per block")
    assert ("cuKernelSetAttribute", (ATTRIBUTE, wide.dynamic_shared_bytes, driver.CUkernel(0x5a), 0)) in calls
    assert checks["mma-forward"]["detail"].startswith("mma_conv2d_forward")
    assert checks["mma-dynamic"]["detail"].startswith(f"{wide.name} ({wide.dynamic_shared_bytes} dynamic")
    assert checks["graph"]["detail"] == "7 launches captured; 2 graph launches equal eager replay"


FAILING = [  # (what is wrong, the stand-in changed, the check that must FAIL, words its error must hold, and the
    #           other checks that fail with it: raising the limit needs the handle)
    ("a handle numba-cuda no longer gives", "loaded_handle", "handle", "expected (CUkernel or CUfunction, int device)",
     {"shared-limit"}),
    ("an attribute that does not stick", "get", "shared-limit", "MAX_DYNAMIC_SHARED_SIZE_BYTES reads 49152", set()),
    ("less opt-in shared memory than the table", "optin", "shared-limit",
     "sm_90 opts in to 101376 shared bytes per block; dynamic_smem.MAX_SHARED_PER_BLOCK says 232448", set()),
    ("a capture that fails", "capture", "graph", "RuntimeError: capture refused (stand-in)", set()),
    ("a graph that replays nothing", "empty graph", "graph", "graph replay differs from eager replay", set()),
]


@pytest.mark.parametrize("wrong, stand_in, check, words, also", FAILING, ids=[f[0] for f in FAILING])
def test_a_broken_assumption_fails_its_own_check_and_no_unrelated_one(tmp_path, monkeypatch, gpu_stand_ins, wrong,
                                                                      stand_in, check, words, also):
    def refuse(kernels):
        raise RuntimeError("capture refused (stand-in)")
    changes = {"loaded_handle": (dynamic_smem, "loaded_handle", lambda spec: (0x5a, 0)),
               "get": (driver, "cuKernelGetAttribute", lambda *a: (driver.CUresult.CUDA_SUCCESS, 48 * 1024)),
               "optin": (gpu_preflight, "device_optin_shared", lambda: ((9, 0), 99 * 1024)),
               "capture": (graph, "capture_graph", refuse),
               "empty graph": (graph, "capture_graph", lambda kernels: SimpleNamespace(launch=lambda s: None))}
    monkeypatch.setattr(*changes[stand_in])
    selected = tuple(c for c in CHECKS if c.name in ("handle", "shared-limit", "graph"))
    out, failures = RecordWriter(str(tmp_path / "p.jsonl")), []
    preflight(out, failures, selected)
    out.close()
    (record,) = _records(tmp_path / "p.jsonl")
    statuses = {c["name"]: c["status"] for c in record["checks"]}
    failed = next(c for c in record["checks"] if c["name"] == check)
    assert record["status"] == "failed" and statuses == {"stream": "PASS", "handle": "PASS", "shared-limit": "PASS",
                                                         "graph": "PASS", **{name: "FAIL" for name in {check} | also}}
    assert words in failed["error"] and failed["traceback"]
    assert f"preflight {check}: {failed['error']}" in failures and len(failures) == 1 + len(also)


def test_in_the_simulator_the_gpu_only_checks_skip_and_say_why(tmp_path):
    selected = tuple(c for c in CHECKS if c.name in ("handle", "shared-limit", "graph"))
    out, failures = RecordWriter(None), []
    results = preflight(out, failures, selected)
    assert [(r["name"], r["status"]) for r in results] == [("stream", "PASS"), ("handle", "SKIP"),
                                                          ("shared-limit", "SKIP"), ("graph", "SKIP")]
    assert "simulator" in results[1]["detail"] and "simulator" in results[3]["detail"] and failures == []


def test_a_check_that_raises_is_recorded_with_its_traceback_and_the_next_check_runs(tmp_path):
    def explode(stream):
        raise ZeroDivisionError("stand-in failure")
    checks = (Check("boom", "nothing", explode), Check("after", "runs anyway", lambda stream: "ran"))
    out, failures = RecordWriter(str(tmp_path / "p.jsonl")), []
    preflight(out, failures, checks)
    out.close()
    boom, after = _records(tmp_path / "p.jsonl")[0]["checks"][1:]
    assert boom["status"] == "FAIL" and boom["error"] == "ZeroDivisionError: stand-in failure"
    assert any("in explode" in line for line in boom["traceback"]) and after == {**after, "status": "PASS",
                                                                                  "detail": "ran"}
    assert failures == ["preflight boom: ZeroDivisionError: stand-in failure"]


# ---- the record of a crashed unit, and a time limit's SIGTERM ------------------------------------------------------

def test_a_crashed_unit_records_its_traceback_and_the_run_goes_on(tmp_path):
    def section():
        raise KeyError("missing")
    out, failures = RecordWriter(str(tmp_path / "r.jsonl")), []
    with Unit(out, "crashing", failures):
        section()
    with Unit(out, "next", failures) as unit:
        unit.fields["ran"] = True
    out.close()
    crashed, following = _records(tmp_path / "r.jsonl")
    assert crashed["status"] == "crashed" and crashed["error"] == "KeyError: 'missing'"
    assert any("in section" in line for line in crashed["traceback"]) and following["ran"] is True


def test_sigterm_records_the_running_unit_as_interrupted_and_stops_the_run(tmp_path):
    previous = signal.getsignal(signal.SIGTERM)
    out = RecordWriter(str(tmp_path / "r.jsonl"))
    try:
        interrupt_on_sigterm()
        with pytest.raises(Interrupted, match="SIGTERM received"):
            with Unit(out, "long section", []) as unit:
                unit.fields["partial"] = 3
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(10 ** 7):   # the handler runs at the next bytecode; never reached to the end
                    pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        out.close()
    (record,) = _records(tmp_path / "r.jsonl")
    assert record["status"] == "interrupted" and record["partial"] == 3 and record["error"].startswith("Interrupted")


@pytest.mark.parametrize("mode", [["--quick"], []], ids=["quick", "full"])
def test_main_writes_the_summary_when_interrupted(tmp_path, monkeypatch, mode):
    from benchmarks.gpu import check as gpu_check

    def first_section(out, failures):
        out.write("compile", "ok")
        with Unit(out, "step-check tiny", failures):
            raise Interrupted("SIGTERM received (stand-in)")
    monkeypatch.setattr(gpu_check.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check, "write_versions", lambda out, failures: out.write("versions", "ok"))
    monkeypatch.setattr(gpu_check, "run_quick", lambda out, budget, failures, *rest: first_section(out, failures))
    monkeypatch.setattr(gpu_check, "run_full", lambda out, only, budget, failures, *rest: first_section(out, failures))
    monkeypatch.setattr(signal, "signal", lambda *args: None)   # main's SIGTERM handler: not in the test process
    status = gpu_check.main(mode + ["--json", str(tmp_path / "q.jsonl")])
    records = _records(tmp_path / "q.jsonl")
    assert status == 1
    # both run their preflight inside run_quick / run_full (each check in its own process, after the warm-up)
    assert [(r["unit"], r["status"]) for r in records] == [("versions", "ok"), ("compile", "ok"),
                                                           ("step-check tiny", "interrupted"),
                                                           ("summary", "interrupted")]
    assert records[-1]["verdict"] == "INTERRUPTED: Interrupted: SIGTERM received (stand-in)"
