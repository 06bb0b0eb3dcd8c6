"""`python -m benchmarks.gpu.check --dry-run`, the CPU-side self-test of the GPU check, run as CI runs it,
and `bash benchmarks/gpu/first_run.sh --dry` (its --quick form, as the runbook runs it on a GPU).

The dry run needs no GPU and no CUDA simulator: it type-checks every kernel launch of the kernel
sections against the kernel table, compiles the plans of the whole-step sections (step-check,
step-replay, step-timing), records each training step as `CudaExecutor` records it, and checks the
PyTorch twins of the timed models against those plans. It exits non-zero on any mismatch.
``--dry-run --quick --json OUT`` runs the first-GPU-run protocol's units on the CPU and writes one
JSON Lines record per unit, the versions record first; a run killed mid-way keeps every finished record.
"""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba", reason="the dry run type-checks the CUDA kernel launches against numba's types "
                                    "(pip install numba numba-cuda)")

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ["cross-check rows at batch", "timing rows at batch", "graph-vs-eager:", "step-check", "step-replay",
            "step-timing"]
MODELS = ["resnet20", "resnet50@128", "mobilenet_v2@128-nodrop", "mobilenet_v2@64", "resnet18-cifar", "resnet50",
          "mobilenet_v2", "resnet18-tv32"]
QUICK_UNITS = ["versions", "compile", "step-check resnet20", "graph-vs-eager resnet20", "step-timing resnet18-cifar",
               "breakdown resnet18-cifar", "torch.compile resnet18-cifar", "estimate", "summary"]
FIRST_RUN_FILES = {"assumptions.txt", "gpu.jsonl", "log.txt", "summary.txt"}
VERSION_FIELDS = ["python", "numpy", "numba", "numba-cuda", "cuda-core", "cuda-bindings", "torch", "torch_cuda",
                  "driver_cuda", "gpu", "sm_count", "clocks", "planner_build"]
# issue 11: gpu: <model> <batch> ours <img/s> (graph) torch-eager-amp <img/s> ratio <x> | max err vs cpu <e> |
#           arena <MiB> vs torch max_memory_allocated <MiB>
NUMBER = r"(?:n/a|[0-9.e+-]+)"
PASTE_LINE = re.compile(rf"^gpu: resnet18-cifar 256 ours {NUMBER} \((?:graph|eager|eager fallback)\) "
                        rf"torch-eager-amp {NUMBER} ratio {NUMBER} \| max err vs cpu {NUMBER} \| arena {NUMBER} vs torch "
                        rf"max_memory_allocated {NUMBER}$")


def _env():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}   # the plain CPU setup of CI
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


@pytest.fixture(scope="module")
def dry_run():
    return subprocess.run([sys.executable, "-m", "benchmarks.gpu.check", "--dry-run"], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """``bash benchmarks/gpu/first_run.sh --dry OUT`` as the runbook has it, with this Python: the assumptions
    test, then ``--dry-run --quick``; ``(the script's run, the check's stdout, its records, OUT)``."""
    out = tmp_path_factory.mktemp("first_run")
    run = subprocess.run(["bash", "benchmarks/gpu/first_run.sh", "--dry", str(out)], cwd=REPO,
                         env=dict(_env(), PYTHON=sys.executable), capture_output=True, text=True, timeout=900)
    log = (out / "log.txt").read_text() if (out / "log.txt").exists() else ""
    records = [json.loads(line) for line in (out / "gpu.jsonl").read_text().splitlines()] \
        if (out / "gpu.jsonl").exists() else []
    return run, log, records, out


@pytest.fixture(scope="module")
def quick(first_run):
    run, log, records, _ = first_run
    check_output = log.split("check: exit")[0]
    return subprocess.CompletedProcess(run.args, 0 if "check: exit 0" in log else 1, check_output, run.stderr), \
        records


def test_dry_run_exits_0(dry_run):
    assert dry_run.returncode == 0, f"stdout:\n{dry_run.stdout[-3000:]}\nstderr:\n{dry_run.stderr[-3000:]}"
    assert "dry run ok:" in dry_run.stdout


def test_dry_run_names_every_section_and_model(dry_run):
    out = dry_run.stdout
    missing = [s for s in SECTIONS if s not in out] + [m for m in MODELS if f" {m} " not in out]
    assert not missing, f"the dry run's output does not name {missing}:\n{out[-3000:]}"


def test_dry_run_runs_every_gemm_row_with_both_kernel_families(dry_run):
    """Issue 12: the conv / linear rows run ``kernels="mma"`` and ``"simt"`` on the same shapes."""
    out = dry_run.stdout
    for row in ["conv3x3-64 fwd +stats", "conv3x3-128-s2 bwd", "conv1x1-256-1024 fwd", "linear 512-1000 fwd",
                "linear 512-1000 bwd"]:
        mma = re.search(rf"^  {re.escape(row)} mma +\d+ launches \(([^)]*)\)", out, re.M)
        simt = re.search(rf"^  {re.escape(row)} simt +\d+ launches \(([^)]*)\)", out, re.M)
        assert mma and simt, f"row {row!r} lacks its mma or simt twin in the dry run's output"
        assert "mma_" in mma.group(1) and "mma_" not in simt.group(1), (mma.group(1), simt.group(1))


def test_dry_run_prints_the_timing_table_with_every_measurement(dry_run):
    out = dry_run.stdout
    for row in ["ours: eager tape replay", "ours: CUDA graph replay", "ours: graph, via train_step()",
                "PyTorch eager AMP channels_last", "torch.compile AMP channels_last"]:
        assert row in out, f"timing table row {row!r} missing"
    assert "PyTorch side NOT CHECKED" not in out, "PyTorch (a test dependency) was not importable"


def test_quick_dry_run_writes_one_record_per_unit_versions_first(quick):
    run, records = quick
    assert run.returncode == 0, f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
    assert [r["unit"] for r in records] == QUICK_UNITS
    versions = records[0]
    missing = [k for k in VERSION_FIELDS if not str(versions.get(k, "")).strip()]
    assert not missing, f"the versions record lacks {missing}: {versions}"
    assert versions["planner_build"] in ("cython", "pure-python")
    assert all(r["status"] in ("ok", "dry", "not-run") for r in records), [(r["unit"], r["status"]) for r in records]
    compiled = records[1]
    assert compiled["kernels"] == len(compiled["per_kernel_s"]) > 30 and compiled["total_s"] > 0
    breakdown = records[5]
    # a whole recorded step: 156 entries (149 launches + transfers) since issue 23 merged its zero-fills, gated
    # the ReLUs, folded the BN finalize into its readers, the residual adds' gradient copies away and the
    # counters into one finish_step; a unit that timed a few kernels only would have far fewer than 100
    assert "STAND-IN" in breakdown["label"] and sum(r["launches"] for r in breakdown["rows"]) > 100
    # a vector kernel (cuda_kernels.vector: ``*_vec8`` / ``*_vec4``) by its one-element twin's name
    assert {"(uploads)", "(downloads)", "sgd_step"} <= {re.sub(r"_vec[48]\b", "", r["name"]) for r in breakdown["rows"]}
    # issue 12: every convolution / linear pass of the step joined with its prediction (stand-in times: none)
    layers = {(r["layer"], r["pass"]): r for r in breakdown["layers"]}
    assert "STAND-IN" in breakdown["layers_label"] and len(layers) == 62   # 20 convs x 3 - stem dgrad + fc x 3
    assert all(r["predicted_ms"] > 0 and r["measured_ms"] == 0 and r["ratio"] is None for r in layers.values())
    # the stem reads its input zero-padded to 8 channels (issue 23 item 3): the aligned weight gradient, no dgrad
    stem_wgrad = layers["conv 8>64 k3s1 32px #0", "wgrad"]["kernels"][0]
    assert stem_wgrad.startswith("mma_conv2d_backward_weight_") and "any_channels" not in stem_wgrad
    assert ("conv 8>64 k3s1 32px #0", "dgrad") not in layers
    assert layers["conv 512>512 k3s1 4px #2", "dgrad"]["kernels"][0].startswith("mma_conv2d_backward_data")


def test_quick_dry_run_prints_the_estimate_and_ends_with_the_paste_line(quick):
    run, records = quick
    lines = run.stdout.strip().splitlines()
    assert PASTE_LINE.match(lines[-1]), f"the last line is not the issue's paste line: {lines[-1]!r}"
    assert records[-1]["paste"] == lines[-1]
    # the estimate is built from times measured here (compile_ptx, a CPU step), which a loaded machine
    # stretches: check that it is printed and that its verdict follows its total, not the total itself
    estimate = [line for line in lines if " s  total: " in line]
    total, share = records[-1]["estimate_s"], records[-1]["estimate_share"]
    assert len(estimate) == 1 and total > 0, estimate
    assert f"{total:6.1f} s  total: {share:.0%} of the 480 s budget" in estimate[0], (total, estimate)
    assert ("within the 70% target" in estimate[0]) == (share <= 0.70), estimate
    terms = next(r for r in records if r["unit"] == "estimate")["terms"]
    assert any("30 tensor-core kernels" in what for what in terms), terms     # every kernel the warm-up JITs
    assert any("start-up" in what for what in terms), terms


def test_first_run_dry_writes_at_most_8_files_and_prints_the_paste_line_last(first_run):
    run, log, records, out = first_run
    assert run.returncode == 0, f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
    files = {p.name for p in out.rglob("*") if p.is_file()}
    assert files == FIRST_RUN_FILES and len(files) <= 8, files
    assert PASTE_LINE.match(run.stdout.strip().splitlines()[-1]), run.stdout[-2000:]
    assert "assumptions: passed with this machine's packages" in log, log[:2000]
    assert records[0]["unit"] == "versions" and records[0]["planner_build"] == "pure-python"
    summary = (out / "summary.txt").read_text()
    assert "dry run ok" in summary and "check: exit 0" in summary, summary


def test_a_killed_run_keeps_every_finished_record(tmp_path):
    """Killed (SIGKILL, no clean-up) right after its second record was announced: the file holds at
    least those records, each a complete JSON line, the versions record first."""
    out = tmp_path / "killed.jsonl"
    process = subprocess.Popen([sys.executable, "-u", "-m", "benchmarks.gpu.check", "--dry-run", "--quick", "--json",
                                str(out)], cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    seen = []
    try:
        for line in process.stdout:
            seen.append(line)
            if line.startswith("[record 2: compile"):
                process.send_signal(signal.SIGKILL)
                break
    finally:
        process.kill()
        process.wait(timeout=60)
        process.stdout.close()
    assert any(line.startswith("[record 2: compile") for line in seen), "".join(seen)[-3000:]
    complete = out.read_text().split("\n")[:-1]          # every newline-terminated line
    records = [json.loads(line) for line in complete]
    assert len(records) >= 2 and [r["unit"] for r in records[:2]] == ["versions", "compile"]
    assert records[-1]["unit"] != "summary", "the run was to be killed before it finished"
