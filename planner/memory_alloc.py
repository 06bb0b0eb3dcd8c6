"""The offset allocator for transient tensors: greedy by size, best fit.

``assign_offsets(sizes, first, last, alignment=256) -> (offsets, arena_bytes)`` places
every tensor (int64 byte sizes, inclusive int32 op-index lifetimes) in one arena so
that no two tensors with intersecting lifetimes overlap; ``live_lower_bound`` is the
largest total live at any op, which no placement can beat. The algorithm, and what it
never plans, is stated in ``planner._memory_py``, the pure-Python twin.

The Cython build ``planner._memory_c`` is used unless ``BLUEPRINT_PURE_PYTHON=1``
selects the twin. A missing build is an error, never a silent slow fallback.

>>> offsets, arena = assign_offsets([512, 256, 512], [0, 1, 2], [0, 1, 2])
>>> offsets.tolist(), arena
([0, 0, 0], 512)
"""
import os

if os.environ.get("BLUEPRINT_PURE_PYTHON") == "1":
    from planner._memory_py import assign_offsets, live_lower_bound
else:
    try:
        from planner._memory_c import assign_offsets, live_lower_bound
    except ImportError as error:
        raise ImportError(
            "the Cython memory allocator planner._memory_c is not built. Build it with "
            "`pip install -e .` or `python setup.py build_ext --inplace`, "
            "or set BLUEPRINT_PURE_PYTHON=1 to use the slower pure-Python twin."
        ) from error

__all__ = ["assign_offsets", "live_lower_bound"]
