"""The offset allocator for transient tensors: best fit in a few orders (greedy by size first), the smallest arena kept;
on small problems still above the lower bound, an exact branch-and-bound search with a placement budget.

``assign_offsets(sizes, first, last, alignment=256) -> (offsets, arena_bytes)`` places
every tensor (int64 byte sizes, inclusive int32 op-index lifetimes) in one arena so
that no two tensors with intersecting lifetimes overlap; ``live_lower_bound`` is the
largest total live at any op, which no placement can beat. The algorithm, and what it
never plans, is stated in ``planner._memory``, its one source.

Each call runs ``planner._memory`` compiled, or its source uncompiled where
``BLUEPRINT_PURE_PYTHON=1`` asks for it or the tree was never built (then with one
warning); ``planner._build`` makes that choice.

>>> offsets, arena = assign_offsets([512, 256, 512], [0, 1, 2], [0, 1, 2])
>>> offsets.tolist(), arena
([0, 0, 0], 512)
"""
from planner._build import load

DEFAULT_ALIGNMENT = 256


def assign_offsets(sizes, first, last, alignment=DEFAULT_ALIGNMENT):
    """Offsets (int64, multiples of ``alignment``) and the arena size in bytes."""
    return load("planner._memory").assign_offsets(sizes, first, last, alignment)


def assign_offsets_by(strategy, sizes, first, last, alignment=DEFAULT_ALIGNMENT):
    """Offsets and arena size of one placement order alone (a name in ``planner._memory.STRATEGIES``)."""
    return load("planner._memory").assign_offsets_by(strategy, sizes, first, last, alignment)


def plan_offsets(sizes, first, last, alignment=DEFAULT_ALIGNMENT):
    """``(offsets, arena_bytes, live_lower_bound)``: ``assign_offsets`` and the bound, which it computes anyway."""
    return load("planner._memory").plan_offsets(sizes, first, last, alignment)


def live_lower_bound(sizes, first, last, alignment=DEFAULT_ALIGNMENT):
    """Largest total of aligned sizes live at any one op; a bound no allocator can beat."""
    return load("planner._memory").live_lower_bound(sizes, first, last, alignment)


__all__ = ["assign_offsets", "assign_offsets_by", "live_lower_bound", "plan_offsets"]
