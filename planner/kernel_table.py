"""Per-path kernel registration: each execution path keeps one `KernelTable` in its own package.

A path registers an implementation of a primitive in one direction against its `Prim`
(``@CPU.implements(Prim.RELU, "forward")``), or says explicitly that the kind does not run on
it (``not_on_path``, with the reason). `check_plan` runs when an executor (or exporter) is built
for a plan, before any step: a kind without an implementation fails there, naming the kind, the
direction, the path and the file to add it to. Nothing falls through to a default.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Iterator, Mapping

from planner.ops import OPS, Prim


class MissingKernelError(NotImplementedError):
    """A path has no implementation registered for a kind it is asked to run."""


class NotOnPathError(ValueError):
    """A kind a path declares it does not run (``not_on_path``), with the reason."""


class KernelTable:
    """Implementations of one path, keyed by (Prim, direction).

    ``home(prim)`` names the file a missing implementation belongs in; ``directions`` are the
    directions this path runs (an exporter runs only "forward" and "loss").
    """

    def __init__(self, path: str, home: Callable[[Prim], str],
                 directions: tuple[str, ...] = ("forward", "backward", "loss")):
        self.path, self.home, self.directions = path, home, directions
        self._impls: dict[tuple[Prim, str], Callable] = {}
        self._absent: dict[tuple[Prim, str], str] = {}

    def implements(self, prims: Prim | tuple[Prim, ...], direction: str):
        """Decorator: register the function as the implementation of ``prims`` in ``direction``."""
        def register(fn):
            for prim in prims if isinstance(prims, tuple) else (prims,):
                self.register(prim, direction, fn)
            return fn
        return register

    def register(self, prim: Prim, direction: str, fn: Callable) -> None:
        key = self._key(prim, direction)
        if key in self._impls or key in self._absent:
            raise ValueError(f"{self.path} kernel table: {prim.value!r} {direction} is registered twice; "
                             f"keep one registration in {self.home(prim)}")
        self._impls[key] = fn

    def _key(self, prim: Prim, direction: str) -> tuple[Prim, str]:
        if not isinstance(prim, Prim) or direction not in self.directions:
            raise ValueError(f"{self.path} kernel table: expected a Prim and one of {self.directions}, "
                             f"got {prim!r}, {direction!r}")
        return prim, direction

    def not_on_path(self, prim: Prim, direction: str, reason: str) -> None:
        """Declare that ``prim`` does not run on this path in ``direction``; asking for it raises ``reason``."""
        key = self._key(prim, direction)
        if key in self._impls or key in self._absent:
            raise ValueError(f"{self.path} kernel table: {prim.value!r} {direction} is registered twice")
        self._absent[key] = reason

    def lookup(self, kind: str, direction: str, where: str = "") -> Callable:
        """The implementation of ``kind`` in ``direction``; raises if there is none."""
        fn = self._impls.get((kind, direction))
        if fn is not None:
            return fn
        name, at = str(kind), f" ({where})" if where else ""
        if (kind, direction) in self._absent:
            raise NotOnPathError(f"{name!r} has no {direction} on the {self.path} path{at}: "
                                 f"{self._absent[kind, direction]}")
        if kind not in OPS:
            raise MissingKernelError(f"{name!r}{at} is not a primitive kind of the op table (planner/ops.py Prim); "
                                     f"the {self.path} path runs only those")
        prim = Prim(kind)
        raise MissingKernelError(f"the {self.path} path has no {direction} implementation of {name!r}{at}; "
                                 f"register one with @implements(Prim.{prim.name}, {direction!r}) in "
                                 f"{self.home(prim)}, or declare not_on_path(...) with the reason")

    def covers(self, prim: Prim, direction: str) -> bool:
        """True when ``prim`` has an implementation or an explicit not-on-path entry in ``direction``."""
        return (prim, direction) in self._impls or (prim, direction) in self._absent

    def required(self, prim: Prim) -> tuple[str, ...]:
        """The directions of ``prim`` this path must cover: its row's directions that the path runs."""
        return tuple(d for d in OPS[prim].directions if d in self.directions)

    def check_plan(self, plan, directions: tuple[str, ...] = ()) -> None:
        """Raise unless every (primitive, direction) that ``plan``'s schedules run is implemented here;
        ``directions``: only those (an exporter runs the forward ops only), default all of the path's."""
        directions, seen = directions or self.directions, set()
        for graph in plan.graphs.values():
            for op in graph.ops:
                if op.layer < 0 or op.direction not in directions:
                    continue
                for prim in _primitives(plan.arch.layers[op.layer]):
                    if (prim.kind, op.direction) not in seen:
                        self.lookup(prim.kind, op.direction, prim.path)
                        seen.add((prim.kind, op.direction))


def _primitives(layer) -> Iterator:
    return iter(layer.sub or (layer,))


def activation_kernels(table: Mapping, pointwise: Callable) -> MappingProxyType:
    """A path's kernels of every activation row of ``table`` (the op table, `planner.ops.OPS`), in table
    order: ``pointwise(row)`` generates them from the row's scalar pair (`planner.scalar_activations`)."""
    return MappingProxyType({prim: pointwise(row) for prim, row in table.items() if row.activation})


def activation_kernels_of(kernels: Mapping, prim):
    """``kernels[prim]``; raises ``ValueError`` naming the activations there are when ``prim`` is none of them."""
    found = kernels.get(prim)
    if found is None:
        raise ValueError(f"activation kernel: expected one of {[p.value for p in kernels]}, got {prim!r}; "
                         f"an activation is a row of the op table: activation(...) in planner/ops.py with its scalar "
                         f"pair in planner/scalar_activations.py")
    return found
