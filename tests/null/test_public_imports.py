"""Tests and benchmarks import the project through public names.

The rule: `pkg/_name.py` is private to its package. A module that anything outside its package imports
(another package, a benchmark, the GPU protocol `benchmarks.gpu`, `tests/support`) has a public name; names a
user needs are re-exported from the package's `__init__` (`__all__`) and imported from there. The only private
imports left are the white-box tests of a private module's own helpers, listed in `ALLOWED` with the reason;
every `import` / `from ... import` of `tests/` and `benchmarks/` is parsed (`ast`), functions included, and
`importlib.import_module("...")` of a literal name counts too.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("blueprint", "planner", "cpu_ref", "cuda_kernels", "tests", "benchmarks")

_CLI = "the CLI's own unit tests: users reach it through `blueprint` (blueprint.cli.main)"
_KERNELS = "white-box kernel tests of a module that no code outside cuda_kernels imports"
ALLOWED = {
    # private module (or name) -> why a test or benchmark may import it
    "blueprint._config_values": _CLI,
    "blueprint._launch": _CLI,
    "blueprint._model_source": _CLI,
    "blueprint._parse": "the DSL text parser's own tests (its limits and value grammar)",
    "blueprint._run_folder": _CLI,
    "blueprint._summary": _CLI,
    "blueprint._train_command": _CLI,
    "blueprint._train_options": _CLI,
    "blueprint._onnx": "the ONNX exporter's op table, checked row by row (users call Model.export_onnx)",
    "blueprint.task._checkpoint": "the checkpoint format's private encoding, tested as bytes",
    "blueprint.task._console": "the console's line format and compile notice",
    "blueprint.task._replica_task": "the world-size check of the data-parallel task",
    "blueprint.task._task": "the task's keyword table and checkpoint format version",
    "blueprint.task.data._image_folder": "the image-folder reader's helpers",
    "blueprint.task.data._sources": "the CIFAR file names the downloader expects",
    "cpu_ref._activation": "the CPU activation kernels' generated source and its fingerprint (numba's cache key)",
    "cpu_ref._blas": "white-box CPU kernel tests",
    "cpu_ref._conv": "white-box CPU kernel tests",
    "cpu_ref._conv_direct": "white-box CPU kernel tests",
    "cpu_ref._conv_winograd": "white-box CPU kernel tests (chunks, partitions and the weight transform)",
    "cpu_ref._epilogue": "white-box CPU kernel tests (the no-epilogue argument a span takes)",
    "cpu_ref._executor": "white-box tests of the training chains' finder (what it refuses to take)",
    "cpu_ref._linear": "white-box CPU kernel tests (the partitions of the fully connected layer's products)",
    "cpu_ref._misc": "white-box CPU kernel tests",
    "cpu_ref._workspace": "white-box CPU kernel tests (which memory a workspace reuses)",
    "cpu_ref._norm": "white-box CPU kernel tests (BatchNorm's channel sums, every remainder of its strips and chunks)",
    "cpu_ref._table": "the CPU path's op table, checked against the registry",
    "cuda_kernels._conv": _KERNELS,
    "cuda_kernels._linear": _KERNELS,
    "cuda_kernels._mma": _KERNELS,
    "cuda_kernels._mma_twins": _KERNELS,
    "cuda_kernels._simulator": _KERNELS,
    "cuda_kernels._table": "the CUDA path's op table, checked against the registry",
    "planner._bounds": "the expander's size limits",
    "planner._build": "which planner build runs (Cython or source); the benchmarks time both",
    "planner._expand": "a compiled (Cython) module: its name stays; tests and benchmarks load its source beside it",
    "planner._memory": "a compiled (Cython) module: its name stays; tests and benchmarks load its source beside it",
    "tests.cuda.test_mma_conv._forward": "one test file reuses another's forward helper",
    "tests.cpu.test_eval_epilogue._zoo_plan": "one test file reuses another's zoo plan (train and eval variants)",
    "tests.cuda.test_mma_conv._dgrad": "one test file reuses another's input-gradient helper",
}


def _private(parts: list[str]) -> str | None:
    """The dotted name up to its first underscore-private part (dunders are public), or None."""
    for i, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:i + 1])
    return None


def private_imports(path: Path) -> list[tuple[int, str]]:
    """(line, private name) of every import of a project module or name that is underscore-private."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        for name in names:
            private = _private(name.split("."))
            if name.split(".")[0] in PROJECT and private:
                found.append((node.lineno, private))
    return found


def all_private_imports() -> dict[str, list[str]]:
    """Private name -> the places (file:line) that import it, over tests/ and benchmarks/."""
    places: dict[str, list[str]] = {}
    for folder in ("tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, private in private_imports(path):
                places.setdefault(private, []).append(f"{path.relative_to(ROOT)}:{line}")
    return places


def test_the_counter_sees_every_form_of_private_import(tmp_path):
    source = tmp_path / "t.py"
    source.write_text("import cuda_kernels._mma\nfrom blueprint._parse import parse_value\n"
                      "from cuda_kernels import _conv, graph\nfrom blueprint.task import load_checkpoint\n"
                      "import numpy._core\ndef f():\n    from planner.memory import _private_helper\n"
                      "    importlib.import_module('planner._memory')\n    from blueprint import __version__\n")
    assert private_imports(source) == [(1, "cuda_kernels._mma"), (2, "blueprint._parse"), (3, "cuda_kernels._conv"),
                                       (7, "planner.memory._private_helper"), (8, "planner._memory")]


def test_tests_and_benchmarks_import_public_names():
    stray = {name: places for name, places in all_private_imports().items() if name not in ALLOWED}
    assert not stray, ("private imports outside the allowlist (import the public name: the package's __init__ or "
                       "a public module; or, for a white-box test of the module's own helper, add it to ALLOWED "
                       f"with the reason): {stray}")


def test_every_allowed_private_import_is_still_used():
    unused = set(ALLOWED) - set(all_private_imports())
    assert not unused, f"allowlisted but no longer imported: remove from ALLOWED: {sorted(unused)}"
