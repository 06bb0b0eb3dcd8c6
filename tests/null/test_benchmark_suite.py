"""The asv suite in `benchmarks/` stays discoverable.

asv imports every module of the benchmark directory and takes every public module-level function and
class method whose name starts with one of its prefixes for a benchmark (asv_runner's discovery);
a helper such as `time_tape(tape, stream)` in a script module then breaks `asv check` ("wrong
number of arguments"). Read from the source with `ast`, so the test needs neither asv nor a GPU.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
ASV_PREFIXES = ("time_", "timeraw_", "mem_", "peakmem_", "track_")


def benchmark_modules():
    return sorted(BENCHMARKS.glob("*.py"))


def test_only_asv_classes_define_benchmark_names():
    stray = []
    for path in benchmark_modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(ASV_PREFIXES):
                stray.append(f"{path.name}:{node.lineno} {node.name}")
    assert not stray, f"asv would take these module-level helpers for benchmarks; rename them: {stray}"


def test_the_planner_benchmarks_are_asv_benchmarks():
    """The compile-time targets are tracked by asv: bench_planner.py holds the timed methods."""
    tree = ast.parse((BENCHMARKS / "bench_planner.py").read_text())
    methods = {f"{c.name}.{f.name}" for c in tree.body if isinstance(c, ast.ClassDef)
               for f in c.body if isinstance(f, ast.FunctionDef) and f.name.startswith(ASV_PREFIXES)}
    assert {"ExpandTree.time_expand_tree", "FromBlueprint.time_from_blueprint", "Compile.time_compile"} <= methods


def test_compile_vs_torch_prints_both_sides():
    """`python -m benchmarks.compile_vs_torch` on the small MLP (torch.compile of its step takes ~15 s here):
    it checks that both sides build the same network and prints our plan time against torch.compile's."""
    pytest.importorskip("torch", reason="PyTorch not installed: the comparison needs it (pip install torch==2.13.0)")
    done = subprocess.run([sys.executable, "-m", "benchmarks.compile_vs_torch", "--model", "mlp", "--batch", "8",
                           "--repeats", "3"], cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| what") and rows[1].startswith("| ours: plan") and " ms |" in rows[1], done.stdout
    ratios = [float(row.rsplit("|", 2)[1].strip().rstrip("x").replace(",", "")) for row in rows[2:]]
    assert len(ratios) == 2 and all(r > 0 for r in ratios), done.stdout


def test_asv_runs_from_the_repository_root():
    """asv.conf.json sits at the root (so `asv run` works from a clone) and names benchmarks/ from there;
    asv allows // comments in it."""
    import json
    root = BENCHMARKS.parent
    text = (root / "asv.conf.json").read_text()
    config = json.loads("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//")))
    assert (config["repo"], config["benchmark_dir"]) == (".", "benchmarks")
    assert not (BENCHMARKS / "asv.conf.json").exists()
    assert (root / config["benchmark_dir"] / "__init__.py").exists()


def test_memory_and_ratios_are_tracked():
    tree = ast.parse((BENCHMARKS / "bench_tracked.py").read_text())
    methods = {f"{c.name}.{f.name}" for c in tree.body if isinstance(c, ast.ClassDef)
               for f in c.body if isinstance(f, ast.FunctionDef) and f.name.startswith(ASV_PREFIXES)}
    assert methods == {"TrainStepMemory.peakmem_train_step", "CompileMemory.peakmem_compile",
                       "MemoryRatios.track_saved_for_backward_ratio_vs_torch",
                       "MemoryRatios.track_transient_over_lower_bound", "CpuStepRatio.track_cpu_step_ratio_vs_torch"}
    setups = {c.name for c in tree.body if isinstance(c, ast.ClassDef)
              for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "setup"}
    assert setups == {"TrainStepMemory", "CompileMemory", "MemoryRatios", "CpuStepRatio"}   # each checks first


@pytest.mark.parametrize("build", ["cython", "pure"])
def test_the_compile_benchmark_runs_with_each_build(build):
    """`asv check` only imports the suite; this runs one Compile benchmark's setup and timed call, so a
    planner function the benchmark swaps (`using`) that no longer exists fails here, not in a later asv run."""
    from benchmarks import bench_planner
    import planner.memory
    before = planner.memory.plan_offsets
    case = bench_planner.Compile()
    case.setup("resnet20", build)
    try:
        case.time_compile("resnet20", build)
        with bench_planner.using(build):
            assert planner.memory.plan_offsets is bench_planner.ALLOCATORS[build].plan_offsets
    finally:
        case.teardown("resnet20", build)
    assert planner.memory.plan_offsets is before
