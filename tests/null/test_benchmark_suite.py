"""The asv suite in `benchmarks/` stays discoverable.

asv imports every module of the benchmark directory and takes every public module-level function and
class method whose name starts with one of its prefixes for a benchmark (asv_runner's discovery);
a helper such as `time_tape(tape, stream)` in a script module then breaks `asv check` ("wrong
number of arguments"). Read from the source with `ast`, so the test needs neither asv nor a GPU.
"""
import ast
from pathlib import Path

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
