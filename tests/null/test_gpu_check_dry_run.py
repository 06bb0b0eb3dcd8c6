"""`benchmarks/gpu_check.py --dry-run`, the CPU-side self-test of the GPU check, run as CI runs it.

The dry run needs no GPU and no CUDA simulator: it type-checks every kernel launch of the kernel
sections against the kernel table, compiles the plans of the whole-step sections (step-check,
step-replay, step-timing), records each training step as `CudaExecutor` records it, and checks the
PyTorch twins of the timed models against those plans. It exits non-zero on any mismatch.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ["cross-check rows at batch", "timing rows at batch", "graph-vs-eager:", "step-check", "step-replay",
            "step-timing"]
MODELS = ["resnet20", "resnet50@128", "mobilenet_v2@128-nodrop", "mobilenet_v2@64", "resnet18-cifar", "resnet50",
          "mobilenet_v2", "resnet18-tv32"]


@pytest.fixture(scope="module")
def dry_run():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}   # the plain CPU setup of CI
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_dry_run_exits_0(dry_run):
    assert dry_run.returncode == 0, f"stdout:\n{dry_run.stdout[-3000:]}\nstderr:\n{dry_run.stderr[-3000:]}"
    assert "dry run ok:" in dry_run.stdout


def test_dry_run_names_every_section_and_model(dry_run):
    out = dry_run.stdout
    missing = [s for s in SECTIONS if s not in out] + [m for m in MODELS if f" {m} " not in out]
    assert not missing, f"the dry run's output does not name {missing}:\n{out[-3000:]}"


def test_dry_run_prints_the_timing_table_with_every_measurement(dry_run):
    out = dry_run.stdout
    for row in ["ours: eager tape replay", "ours: CUDA graph replay", "ours: graph, via train_step()",
                "PyTorch eager AMP channels_last", "torch.compile AMP channels_last"]:
        assert row in out, f"timing table row {row!r} missing"
    assert "PyTorch side NOT CHECKED" not in out, "PyTorch (a test dependency) was not importable"
