"""Tensor-core tiles that must not run in this process; an excluded (direction, tile) runs SIMT.

- ``BLUEPRINT_MMA_EXCLUDE="forward:128x128x32,wgrad:128x64x32"``: tiles that failed their check on this
  device (benchmarks/gpu writes it for the units after the preflight, and its records say so);
- what this install lacks (``compat``): no ``alignment=`` keyword excludes every tile, no way to raise
  the dynamic shared memory limit excludes the tiles whose pipeline needs more than 48 KB."""
import os

from . import compat
from .dynamic_smem import STATIC_SHARED_LIMIT

DIRECTIONS = ("forward", "dgrad", "wgrad")
ENV = "BLUEPRINT_MMA_EXCLUDE"


def parse(text):
    """``frozenset((direction, tile name))`` of ``"direction:tile,..."``; raises ``ValueError`` on a bad item."""
    pairs = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        direction, _, tile = item.partition(":")
        if direction not in DIRECTIONS or not tile:
            raise ValueError(f"{ENV}: expected items 'direction:tile' with a direction of {DIRECTIONS}, "
                             f"got {item!r}")
        pairs.add((direction, tile))
    return frozenset(pairs)


def format_exclusions(pairs):
    return ",".join(f"{direction}:{tile}" for direction, tile in sorted(pairs))


EXCLUDED = parse(os.environ.get(ENV, ""))


def excluded(direction, tile, dynamic_shared_bytes, features=None, pairs=None):
    """True when ``tile`` must not run ``direction`` here (its kernel takes ``dynamic_shared_bytes``)."""
    features = compat.FEATURES if features is None else features
    if not features["shared-alignment"].available:
        return True
    if dynamic_shared_bytes > STATIC_SHARED_LIMIT and not features["dynamic-shared"].available:
        return True
    return (direction, tile.name) in (EXCLUDED if pairs is None else pairs)
