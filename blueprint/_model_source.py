"""What the CLI's subcommands share: its error class and finding a model by zoo name or in a file.

Its own module so that `cli` (the parser and `main`) and `_train_command` both import it and
not each other.
"""
from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

from blueprint import zoo
from blueprint._layer import BluePrint, Layer


class CliError(Exception):
    """A mistake in the command line or the model file; printed as one `error: ...` line."""


def load_model(spec: str, input_shape: tuple[int, int, int] | None) -> tuple[BluePrint, tuple[int, int, int]]:
    """A zoo name, or `path/to/file.py:attr`; returns the BluePrint and the (H, W, C) to plan for."""
    if spec in zoo.MODELS:
        entry = zoo.MODELS[spec]
        return entry.build(), input_shape or entry.input_shape
    path, colon, attr = spec.rpartition(":")
    if not colon and spec.endswith(".py"):
        raise CliError(f"{spec}: name the BluePrint in the file after a colon, like {spec}:bp")
    if not colon:
        raise CliError(f"unknown model {spec!r}: expected a zoo name ({', '.join(zoo.MODELS)}) "
                       f"or path/to/file.py:attr")
    bp = load_blueprint_file(Path(path), attr)
    if input_shape is None:
        raise CliError(f"{spec}: a model from a file needs --input-shape H,W,C (e.g. --input-shape 32,32,3)")
    return bp, input_shape


def load_blueprint_file(path: Path, attr: str) -> BluePrint:
    if not path.is_file():
        raise CliError(f"{path}: no such file (MODEL is a zoo name or path/to/file.py:attr)")
    if not attr.isidentifier():
        raise CliError(f"{path}:{attr}: expected an attribute name after the colon, like {path}:bp")
    module_spec = importlib.util.spec_from_file_location(f"_blueprint_user_model_{path.stem}", path)
    if module_spec is None:
        raise CliError(f"{path}: not a Python file (MODEL is a zoo name or path/to/file.py:attr)")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:  # the user's code: report it as one line whatever it raised
        raise CliError(f"{path}: running the file raised {type(error).__name__}: {error}") from error
    if not hasattr(module, attr):
        found = sorted(n for n, v in vars(module).items() if isinstance(v, BluePrint) and not n.startswith("_"))
        hint = f"; BluePrints it defines: {', '.join(found)}" if found else ""
        raise CliError(f"{path} has no attribute {attr!r}{hint}")
    value = getattr(module, attr)
    if callable(value) and not isinstance(value, BluePrint):
        try:
            inspect.signature(value).bind()
        except (TypeError, ValueError):
            raise CliError(f"{path}:{attr} is a callable that needs arguments; expected a BluePrint or a "
                           f"function of no arguments returning one") from None
        try:
            value = value()
        except Exception as error:  # the user's code: report it as one line whatever it raised
            raise CliError(f"{path}:{attr}() raised {type(error).__name__}: {error}") from error
    if not isinstance(value, BluePrint):
        hint = f"; wrap the layer as BluePrint({attr})" if isinstance(value, Layer) else ""
        raise CliError(f"{path}:{attr} has type {type(value).__name__}, expected a BluePrint "
                       f"(or a function of no arguments returning one){hint}")
    return value
