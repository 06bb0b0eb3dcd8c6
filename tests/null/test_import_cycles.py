"""No import cycles between the project's modules, and no import from a low layer up to a high one.

Every module of `blueprint`, `planner`, `cpu_ref` and `cuda_kernels` is parsed (`ast`, never
imported); every `import` / `from ... import` statement counts, at module level and inside
functions (a lazy import that closes a circle is still a circle, only one that fails later).
`from package import name` is an edge to `package.name` where that is a module, else to the
package. A cycle is printed as the chain of modules that closes it.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("blueprint", "planner", "cpu_ref", "cuda_kernels")


def module_files() -> dict[str, Path]:
    """Module name -> source file, for every .py file of the project's packages (the Cython
    modules are `.py` sources too)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The project modules that `module` imports anywhere in its source."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, path.name == "__init__.py", node)
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in known else target)
    return {name for name in found if name in known and name != module}


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {module: imports_of(module, path, set(files)) for module, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle as [a, b, ..., a], or [] when the graph is acyclic (iterative depth-first search)."""
    state: dict[str, int] = {}     # 1: on the current path, 2: finished
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return []


@pytest.mark.parametrize("graph, cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"a2"}, "a2": set(), "b": {"b"}}, ["b", "b"]),
])
def test_find_cycle_finds_a_cycle_exactly_when_there_is_one(graph, cycle):
    assert find_cycle(graph) == cycle


def test_relative_imports_resolve_to_project_modules(tmp_path):
    source = tmp_path / "__init__.py"
    source.write_text("from . import _ops\nfrom .tape import Tape\nfrom .. import planner\n"
                      "def f():\n    from planner.verify import verify_plan\n")
    known = {"cuda_kernels", "cuda_kernels._ops", "cuda_kernels.tape", "planner", "planner.verify"}
    assert imports_of("cuda_kernels", source, known) == {"cuda_kernels._ops", "cuda_kernels.tape", "planner.verify"}


def test_the_graph_sees_every_package_and_its_lazy_imports():
    graph = import_graph()
    assert {m.split(".")[0] for m in graph} == set(PACKAGES)
    # a function-level import in the CUDA executor's launch code
    assert "blueprint.optim" in graph["cuda_kernels._ops"]


def test_no_import_cycles_between_project_modules():
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle) + " (move what both need into a module that neither imports)"


# Layers: the DSL and configuration vocabulary that the planner and both executors import sits below
# the task, the CLI, the trained Model and the distributed code, and never imports them (not even
# lazily, inside a function): an executor that reached up into the task could not be tested without it.
LOW_PACKAGES = ("planner", "cpu_ref", "cuda_kernels")
LOW_MODULES = frozenset({"blueprint._layer", "blueprint._factories", "blueprint.optim", "blueprint._errors"})
HIGH_PACKAGES = ("blueprint.task", "blueprint.distributed")
HIGH_MODULES = frozenset({
    "blueprint",                                        # its __init__ re-exports Model and the zoo
    "blueprint.__main__", "blueprint.cli", "blueprint._train_command", "blueprint._predict_command",
    "blueprint._launch", "blueprint._run_folder",       # the CLI
    "blueprint._model", "blueprint._model_source", "blueprint._onnx",   # the trained Model and its export
})


def is_low(module: str) -> bool:
    return module in LOW_MODULES or module.split(".")[0] in LOW_PACKAGES


def is_high(module: str) -> bool:
    return module in HIGH_MODULES or any(module == p or module.startswith(p + ".") for p in HIGH_PACKAGES)


def upward_import(graph: dict[str, set[str]], is_low=is_low, is_high=is_high) -> list[str]:
    """One chain [low, ..., high] of imports from a low module to a high one, or [] when there is none
    (breadth-first from every low module, so the chain printed is a shortest one)."""
    for start in sorted(m for m in graph if is_low(m)):
        came_from, queue = {start: None}, [start]
        for module in queue:
            if is_high(module):
                chain = [module]
                while came_from[chain[-1]] is not None:
                    chain.append(came_from[chain[-1]])
                return chain[::-1]
            for nxt in sorted(graph.get(module, ())):
                if nxt not in came_from:
                    came_from[nxt] = module
                    queue.append(nxt)
    return []


@pytest.mark.parametrize("graph, chain", [
    ({"low": {"mid"}, "mid": {"other"}, "other": set(), "high": {"low"}}, []),     # high importing low is fine
    ({"low": {"mid"}, "mid": {"high"}, "high": set()}, ["low", "mid", "high"]),
    ({"low": {"high", "mid"}, "mid": {"high"}, "high": set()}, ["low", "high"]),
])
def test_upward_import_finds_a_chain_exactly_when_there_is_one(graph, chain):
    assert upward_import(graph, is_low=lambda m: m == "low", is_high=lambda m: m == "high") == chain


def test_the_layers_name_existing_modules():
    graph = import_graph()
    assert LOW_MODULES <= set(graph) and HIGH_MODULES <= set(graph)
    assert all(any(m.startswith(p + ".") for m in graph) for p in HIGH_PACKAGES)
    assert {m for m in graph if is_low(m) and is_high(m)} == set()


def test_no_low_layer_imports_a_high_one():
    chain = upward_import(import_graph())
    assert not chain, ("a low layer imports a high one: " + " -> ".join(chain) + " (the DSL, configs, planner and "
                       "executors must not depend on the task, CLI, Model or distributed code: pass what is needed "
                       "in as an argument, or move the shared piece down)")
