"""`python -m benchmarks.gpu.check --quick`'s device path, run in the simulator on a tiny stand-in network, so
that a first GPU run does not discover its bugs: every unit writes its record, graph capture made to
fail falls back to eager and the records and the paste line say so (issue 11, items 3-4). The units run
in this process (``isolate.run_in_process``: the monkeypatched model reaches them), every budget (the run's
and the units' own) on a frozen clock (the outcome cannot depend on this machine's speed); isolation itself:
tests/null/test_gpu_isolate.py and test_gpu_quick_run.py."""
import json

import numpy as np
import pytest


pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),   # simulator only
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore::cuda_kernels.graph.GraphCaptureWarning")]


def tiny():
    from blueprint import BluePrint, cbr, gap_fc, seq
    return BluePrint(seq(cbr(8, 3, 1, 1), gap_fc(10)), "tiny")


def test_the_quick_units_run_on_a_device_and_record_a_capture_fallback(tmp_path, monkeypatch):
    from benchmarks.gpu import budget, quick, quick_run, steps, timing
    from benchmarks.gpu.isolate import run_in_process
    from benchmarks.gpu.protocol import RecordWriter
    from benchmarks.gpu.budget import Budget, FrozenClock
    from benchmarks.gpu.step_common import StepModel
    from cuda_kernels import graph
    from cuda_kernels.vector import one_element_name

    def refuse(kernels):
        raise RuntimeError("capture refused (test)")
    monkeypatch.setattr(graph, "graph_support", lambda: (True, ""))
    monkeypatch.setattr(graph, "capture_graph", refuse)
    # batch 2 of 4x4 images: 32 pixels, one simulator tile of rows and one k-tile of the weight gradient per
    # step (the kernels themselves are checked in test_mma_conv.py); each of the ~20 steps then costs half
    model = StepModel("tiny", tiny, 2, 4, "a stand-in for resnet18-cifar")
    for name in ("QUICK_CHECK", "QUICK_REPLAY", "QUICK_TIMING"):
        monkeypatch.setattr(quick, name, model)
    monkeypatch.setattr(budget, "DEFAULT_CLOCK", FrozenClock())   # the units' own budgets do not run out either
    monkeypatch.setattr(timing, "TIMED_S", 0.05)
    monkeypatch.setattr(timing, "MIN_TIMED_STEPS", 1)   # a stand-in step takes seconds in the simulator
    monkeypatch.setattr(timing, "WARMUP_STEPS", 0)
    monkeypatch.setattr(steps, "REPLAY_STEPS", 2)
    out = RecordWriter(str(tmp_path / "quick.jsonl"))
    failures, skipped, notes = [], [], []
    summary = quick_run.run_quick(out, Budget(480, clock=FrozenClock()), failures, skipped, notes,
                                  runner=run_in_process, warmup_names=["sgd_step"], tile_names=(),
                                  check_names=("graph",))
    out.close()
    records = {r["unit"]: r for r in map(json.loads, (tmp_path / "quick.jsonl").read_text().splitlines())}
    assert list(records) == ["compile", "preflight", "tiles", "step-check tiny", "graph-vs-eager tiny",
                             "step-timing tiny", "torch.compile tiny", "breakdown tiny"]
    graph_check, = records["preflight"]["checks"]   # the capture this test refuses: its FAIL, before any step
    assert records["preflight"]["status"] == "failed" and graph_check["error"] == "RuntimeError: capture refused (test)"
    assert records["step-check tiny"]["status"] == "ok", records["step-check tiny"]
    assert np.isfinite(summary["max_err"]) and summary["max_err"] < 2e-2
    replay = records["graph-vs-eager tiny"]
    assert replay["status"] == "failed" and not replay["captured"]
    assert replay["replay"].startswith("eager (fell back: graph capture failed")
    assert any("graph replay asked for, eager (fell back" in f for f in failures), failures
    timing = records["step-timing tiny"]
    assert timing["ours graph"]["replay"].startswith("eager (fell back") and not timing["ours graph"]["graph"]
    assert timing["ours eager"]["seconds"] > 0 and "error" in timing["torch eager"]   # no CUDA torch here
    breakdown = records["breakdown tiny"]
    assert breakdown["status"] == "ok" and {"(uploads)", "(downloads)", "sgd_step"} <= \
        {one_element_name(row["name"]) for row in breakdown["rows"]}   # the vector SGD or its one-element twin
    # measured (here: the simulator's, labelled a stand-in) beside the model's prediction, per layer and pass
    assert "STAND-IN" in breakdown["layers_label"] and "simulator" in breakdown["layers_label"]
    layers = {(r["layer"], r["pass"]): r for r in breakdown["layers"]}
    # the stem reads its input padded to 8 channels (issue 23 item 3: the aligned tensor-core kernels)
    assert set(layers) == {("conv 8>8 k3s1 4px #0", "forward"), ("conv 8>8 k3s1 4px #0", "wgrad"),
                           ("linear 8>10 #0", "forward"), ("linear 8>10 #0", "wgrad"), ("linear 8>10 #0", "dgrad")}
    for row in layers.values():
        assert row["measured_ms"] > 0 and row["predicted_ms"] > 0
        assert row["ratio"] == pytest.approx(row["measured_ms"] / row["predicted_ms"])
    assert layers["conv 8>8 k3s1 4px #0", "forward"]["kernels"][0].startswith("mma_conv2d_forward")
    line = quick.summary_line(summary)
    assert line.startswith("gpu: tiny 2 ours ") and "(eager fallback) torch-eager-amp n/a ratio n/a" in line
    assert "| max err vs cpu " in line and "arena " in line
