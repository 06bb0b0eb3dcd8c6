"""What the expander accepts, measured on the tree before a single record is built.

The tree is known before it is expanded, so its nesting depth and the number of layers it
expands to (a `repeat` multiplies its body's count) are computed first, iteratively and once
per shared subtree, and a tree past either limit is refused with the number found:

- `MAX_NESTING_DEPTH`: the expander walks the tree recursively (a C call per level compiled,
  a few Python frames per level uncompiled); bounding the depth bounds its stack, so no tree
  can overflow it (a segfault compiled, a RecursionError uncompiled).
- `MAX_EXPANDED_LAYERS`: DSL leaves after every `repeat` copy (a block or an mbconv counts
  one); the expander builds a record per primitive, so this bounds its memory and time.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager

from planner._expand_error import ExpandError

MAX_NESTING_DEPTH = 1000
MAX_EXPANDED_LAYERS = 20_000
PYTHON_FRAMES_PER_LEVEL = 3   # walk -> walk_seq / walk_add2 -> walk, and a `named` level on top
FRAME_HEADROOM = 200


def measure(root) -> tuple[int, int]:
    """(nesting depth, expanded layer count) of the `Layer` tree `root`, without recursion."""
    depth_of: dict[int, int] = {}
    count_of: dict[int, int] = {}
    stack = [root]
    while stack:
        node = stack[-1]
        if id(node) in count_of:
            stack.pop()
            continue
        pending = [child for child in node.children if id(child) not in count_of]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        children = node.children
        depth_of[id(node)] = 1 + max((depth_of[id(c)] for c in children), default=0)
        count = sum(count_of[id(c)] for c in children) if children else 1
        times = getattr(node.params, "times", None) if node.kind.value == "repeat" else None
        count_of[id(node)] = count * times if times is not None else count
    return depth_of[id(root)], count_of[id(root)]


def check_tree(root) -> int:
    """Refuse a tree past either limit (see the module docstring); its nesting depth otherwise."""
    depth, count = measure(root)
    if depth > MAX_NESTING_DEPTH:
        raise ExpandError(f"the network is nested {depth:,} levels deep; the planner accepts at most "
                          f"{MAX_NESTING_DEPTH:,} (seq/add2/repeat/named inside one another); flatten the nesting, "
                          "e.g. seq(a, b, c) instead of seq(seq(a, b), c)")
    if count > MAX_EXPANDED_LAYERS:
        raise ExpandError(f"the network expands to {count:,} layers (repeat() copies included); the planner "
                          f"accepts at most {MAX_EXPANDED_LAYERS:,}; lower the repeat() counts")
    return depth


@contextmanager
def recursion_room(depth: int):
    """Room on Python's recursion limit for the uncompiled expander's walk of a `depth`-deep tree
    (compiled, the walk makes C calls, which the limit does not count)."""
    previous = sys.getrecursionlimit()
    needed = _frames_in_use() + PYTHON_FRAMES_PER_LEVEL * depth + FRAME_HEADROOM
    if needed > previous:
        sys.setrecursionlimit(needed)
    try:
        yield
    finally:
        if needed > previous and sys.getrecursionlimit() == needed:
            sys.setrecursionlimit(previous)


def _frames_in_use() -> int:
    frame, count = sys._getframe(), 0
    while frame is not None:
        frame, count = frame.f_back, count + 1
    return count
