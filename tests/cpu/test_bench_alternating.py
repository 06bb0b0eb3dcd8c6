"""`benchmarks.alternating`: the rounds alternate their order, the ratios are pairwise, and the
AVX2 stand-in really lowers what numba emits and which OpenBLAS kernels run."""
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import alternating

ROOT = Path(__file__).resolve().parents[2]


def test_rounds_alternate_which_side_runs_first_and_pair_each_round():
    calls = []

    def side(name):
        def run():
            calls.append(name)
            return f"{name}{sum(1 for c in calls if c == name)}"
        return run

    pairs = alternating.alternate(side("ours"), side("theirs"), rounds=4)
    assert calls == ["ours", "theirs", "theirs", "ours", "ours", "theirs", "theirs", "ours"]
    assert pairs == [("ours1", "theirs1"), ("ours2", "theirs2"), ("ours3", "theirs3"), ("ours4", "theirs4")]


def test_the_ratio_is_the_median_of_the_pairwise_ratios_with_their_range():
    # pairwise 2, 3, 2 -> median 2; the ratio of the medians (3 / 1) would be 3
    assert alternating.ratio_summary([2.0, 3.0, 4.0], [1.0, 1.0, 2.0]) == "2.00 [2.00-3.00]"


def test_every_thread_pool_gets_the_same_count():
    env = alternating.child_environment(3, "native")
    assert [env[name] for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS",
                                   "NUMBA_NUM_THREADS")] == ["3"] * 4



def test_a_side_runs_as_a_module_from_the_repository_root(tmp_path, monkeypatch):
    """A side is `python -m benchmarks.<name>` started at the repository root, whatever the parent's working
    directory (no sys.path edits); the parent keeps the JSON object of the child's last line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "result.json").write_text('{"seconds": [1, 2]}')
    assert alternating.run_child("json.tool", ["--compact", str(tmp_path / "result.json")], dict(os.environ),
                                 timeout=60) == {"seconds": [1, 2]}
    # found the package benchmarks (the repository root is the child's directory), not its module
    with pytest.raises(RuntimeError, match=r"No module named '?benchmarks\.no_such_side"):
        alternating.run_child("benchmarks.no_such_side", [], dict(os.environ), timeout=60)

@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the AVX2 stand-in is for x86-64 machines")
def test_the_avx2_standin_lowers_numba_and_openblas():
    pytest.importorskip("threadpoolctl", reason="the BLAS kernel set is read with threadpoolctl")
    code = "import json; from benchmarks import alternating; print(json.dumps(alternating.runtime_info('ours')))"
    done = subprocess.run([sys.executable, "-c", code], env=alternating.child_environment(1, "avx2"), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info["numba_target"] == "haswell"
    assert info["numba_vectors"] == "AVX2 (ymm)"
    assert info["blas"] and all(entry.endswith(" Haswell") for entry in info["blas"]), info["blas"]
