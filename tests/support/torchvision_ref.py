"""torchvision's own model definitions, the reference for keys, counts and outputs.

torchvision 0.28's C++ operators (nms, roi_align, ...) fail to register against some torch
builds ("operator torchvision::nms does not exist"), and that happens in
``torchvision._meta_registrations`` at import time. The model definitions are pure Python
and do not use those operators, so where the plain import fails this module imports
torchvision with that one registration module replaced by an empty one. Nothing else is
changed, and a torchvision that imports normally is used as is.

>>> tv = torchvision_or_skip()          # doctest: +SKIP
>>> tv.models.resnet18()                # doctest: +SKIP
"""
from __future__ import annotations

import importlib
import sys
import types

_META = "torchvision._meta_registrations"


def import_torchvision():
    """The torchvision module, or raise ImportError saying why it cannot be imported."""
    try:
        return importlib.import_module("torchvision")
    except ImportError:
        raise
    except RuntimeError as error:              # the C++ operator registration failed
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules[_META] = types.ModuleType(_META)
        try:
            return importlib.import_module("torchvision")
        except Exception as second:
            raise ImportError(f"torchvision does not import ({error}); without its operator "
                              f"registrations it still fails: {second}") from second


def torchvision_or_skip():
    """torchvision for a test, or skip the test saying why (pip install torchvision==0.28.0)."""
    import pytest
    try:
        return import_torchvision()
    except ImportError as error:
        pytest.skip(f"torchvision not importable ({error}); pip install torchvision==0.28.0 pillow")
