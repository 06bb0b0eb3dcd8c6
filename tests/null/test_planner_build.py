"""Which build of the planner runs: the compiled Cython modules, or their one source uncompiled.

A tree that was never built (a fresh clone, a copy on a device machine) must run the whole planner
on the uncompiled source, warn exactly once per process naming the build command, and say so in
`planner.build_kind()` and `blueprint plan`; `BLUEPRINT_PURE_PYTHON=1` chooses the source silently.
"""
from __future__ import annotations

import ast
import importlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import planner
from planner import _build

REPO = Path(__file__).resolve().parents[2]
NOT_BUILT_WARNING = "is not compiled (a source tree that was never built)"
MODELS = ("resnet20", "mobilenet_v2")  # two compiles in one process: still one warning

# Compiles two zoo models with verify() and prints what a build must agree on, one JSON line each.
PLANNER_SCRIPT = f"""
import json, planner
from blueprint import zoo
from planner import ArchPlan
from planner.compiler import Compiler
for name in {MODELS!r}:
    entry = zoo.MODELS[name]
    arch = ArchPlan.from_blueprint(entry.build(), in_channels=entry.input_shape[2])
    plan = Compiler(arch).compile({{"train": (2, *entry.input_shape), "eval": (1, *entry.input_shape)}})
    plan.verify()
    print(json.dumps({{"model": name, "kinds": [l.kind for l in arch.layers], "report": plan.memory.report(),
                      "offsets": [t.offset for t in plan.tensors]}}))
import planner._expand, planner._memory
print(json.dumps({{"build": planner.build_kind(), "files": [planner._expand.__file__, planner._memory.__file__]}}))
"""


def plan_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def run(args: list[str], cwd: Path, pure: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("BLUEPRINT_PURE_PYTHON", "PYTHONWARNINGS")}
    env["PYTHONPATH"] = str(cwd)
    if pure:
        env["BLUEPRINT_PURE_PYTHON"] = "1"
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def clean_tree(tmp_path_factory) -> Path:
    """The project's source files (what git tracks, plus new files it does not ignore) copied
    into an empty folder: no compiled module, no generated C."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout of the project to list its source files (git ls-files)")
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    tree = tmp_path_factory.mktemp("never_built")
    for name in listed:
        if (REPO / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / name, tree / name)
    built = [p.name for p in (tree / "planner").iterdir() if p.suffix in (".so", ".pyd", ".c")]
    assert not built and (tree / "planner" / "_expand.py").is_file() and (tree / "planner" / "_memory.pxd").is_file()
    return tree


def test_a_tree_never_built_runs_the_whole_planner_and_warns_once(clean_tree):
    done = run(["-c", PLANNER_SCRIPT], clean_tree)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count(NOT_BUILT_WARNING) == 1, done.stderr
    assert "RuntimeWarning" in done.stderr and "pip install -e ." in done.stderr
    assert "python setup.py build_ext --inplace" in done.stderr
    *plans, status = plan_lines(done.stdout)
    assert status["build"] == "pure-python"
    assert [Path(f) for f in status["files"]] == [clean_tree / "planner" / "_expand.py",
                                                  clean_tree / "planner" / "_memory.py"]
    # The same plans as this checkout's build (compiled where it is built), tensor offset for tensor offset.
    here = run(["-c", PLANNER_SCRIPT], REPO)
    assert here.returncode == 0, here.stderr[-3000:]
    assert [p["model"] for p in plans] == list(MODELS) and plans == plan_lines(here.stdout)[:-1]


def test_a_tree_never_built_chosen_pure_python_does_not_warn(clean_tree):
    done = run(["-c", PLANNER_SCRIPT], clean_tree, pure=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert NOT_BUILT_WARNING not in done.stderr and "Warning" not in done.stderr
    assert plan_lines(done.stdout)[-1]["build"] == "pure-python"


def test_blueprint_plan_in_a_tree_never_built_says_which_build_ran(clean_tree):
    done = run(["-m", "blueprint", "plan", "small_cnn", "--batch", "2"], clean_tree)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "planner build: pure-python"
    assert done.stderr.count(NOT_BUILT_WARNING) == 1, done.stderr


# ---- in this process: the choice, the one warning, build_kind() ----------------------------------
@pytest.fixture
def never_built(monkeypatch):
    """This process as if the tree were never built: `import planner._expand` / `planner._memory`
    find the `.py` sources, and no warning has been given yet."""
    monkeypatch.delenv("BLUEPRINT_PURE_PYTHON", raising=False)
    monkeypatch.setattr(_build, "_warned", False)
    for name in _build.CYTHON_MODULES:
        monkeypatch.setitem(sys.modules, name, _build.source(name))


def test_loading_a_module_that_is_not_compiled_warns_once_per_process(never_built):
    with pytest.warns(RuntimeWarning) as caught:
        modules = [_build.load(name) for name in _build.CYTHON_MODULES * 3]
        assert planner.build_kind() == "pure-python"
    assert [str(w.message).count(NOT_BUILT_WARNING) for w in caught] == [1]
    message = str(caught[0].message)
    assert "pip install -e ." in message and "build_ext --inplace" in message and "BLUEPRINT_PURE_PYTHON=1" in message
    assert all(not _build.is_compiled(m) for m in modules)


def test_pure_python_switch_chooses_the_source_without_a_warning(never_built, monkeypatch):
    monkeypatch.setenv("BLUEPRINT_PURE_PYTHON", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [_build.load(name) for name in _build.CYTHON_MODULES] == [
            _build.source(name) for name in _build.CYTHON_MODULES]
        assert planner.build_kind() == "pure-python"


def test_build_kind_reports_the_compiled_modules_where_they_are_built(monkeypatch):
    monkeypatch.delenv("BLUEPRINT_PURE_PYTHON", raising=False)
    compiled = [_build.is_compiled(importlib.import_module(name)) for name in _build.CYTHON_MODULES]
    if not all(compiled):
        pytest.skip("planner's Cython modules are not compiled here: run `python setup.py build_ext --inplace`")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert planner.build_kind() == "cython"


def test_source_refuses_a_module_that_is_not_one_of_the_cython_sources():
    with pytest.raises(ValueError, match=r"expected one of \('planner._expand', 'planner._memory'\), got 'planner.expand'"):
        _build.source("planner.expand")


def test_setup_compiles_exactly_the_modules_the_planner_loads_each_from_one_source():
    tree = ast.parse((REPO / "setup.py").read_text())
    listed = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                  and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["CYTHON_MODULES"])
    assert tuple(ast.literal_eval(listed)) == _build.CYTHON_MODULES
    for name in _build.CYTHON_MODULES:
        stem = REPO / name.replace(".", "/")
        assert stem.with_suffix(".py").is_file() and stem.with_suffix(".pxd").is_file(), stem
    assert not list((REPO / "planner").glob("*.pyx")), "a hand-written .pyx is back: keep one .py + .pxd source"
