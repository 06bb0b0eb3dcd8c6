"""Which build of the planner's Cython modules runs: compiled, or the same source uncompiled.

`planner._expand` (the tree expander) and `planner._memory` (the offset allocator) are each one
`.py` source in Cython's pure-Python mode, typed by the `.pxd` beside it. `setup.py` compiles
each into an extension module next to its source, and Python's import system prefers the
extension when both exist.

- `load(name)`: the module in use. `BLUEPRINT_PURE_PYTHON=1` selects the `.py` source, silently;
  otherwise the compiled extension, or, on a tree that was never built, the `.py` source with one
  `RuntimeWarning` per process naming the build command.
- `source(name)`: the `.py` source, loaded as the module `name + "_source"` even where the
  extension exists: the oracle that the twin tests compare the compiled module against.
- `build_kind()`: "cython" when every module in use is compiled, else "pure-python".
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

CYTHON_MODULES = ("planner._expand", "planner._memory")
BUILD_COMMAND = "`pip install -e .` (or `python setup.py build_ext --inplace`)"
_warned = False


def pure_python_requested() -> bool:
    return os.environ.get("BLUEPRINT_PURE_PYTHON") == "1"


def is_compiled(module: ModuleType) -> bool:
    """Whether `module` was loaded from an extension module rather than from Python source."""
    origin = getattr(module.__spec__, "origin", None) or ""
    return origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def source(name: str) -> ModuleType:
    """The `.py` source of the Cython module `name`, never its extension (see the module docstring)."""
    if name not in CYTHON_MODULES:
        raise ValueError(f"source(name): expected one of {CYTHON_MODULES}, got {name!r}")
    alias = name + "_source"
    module = sys.modules.get(alias)
    if module is None:
        path = Path(__file__).with_name(name.rpartition(".")[2] + ".py")
        spec = importlib.util.spec_from_file_location(alias, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[alias] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[alias]
            raise
    return module


def load(name: str) -> ModuleType:
    """The module `name` in use: see the module docstring for the choice and the one warning."""
    if pure_python_requested():
        return source(name)
    module = importlib.import_module(name)
    if not is_compiled(module):
        _warn_not_built(name)
    return module


def build_kind() -> str:
    return "cython" if all(is_compiled(load(name)) for name in CYTHON_MODULES) else "pure-python"


def _warn_not_built(name: str) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    warnings.warn(f"{name} is not compiled (a source tree that was never built): the planner runs its Cython "
                  f"modules as plain Python, with the same plans but slower. Build them with {BUILD_COMMAND}, "
                  f"or set BLUEPRINT_PURE_PYTHON=1 to choose the pure-Python build without this warning.",
                  RuntimeWarning, stacklevel=3)
