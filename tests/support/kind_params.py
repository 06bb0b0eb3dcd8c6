"""Every parameterised kind's parameters, derived from the op table and the DSL records, for the tests.

A kind is *parameterised* here when its op-table row reads parameters (`attrs`), it is shape-preserving and
deterministic (no saved mask), and its DSL factory has the kind's name: every activation with parameters,
and prelu. Its DSL record's fields are the row's attrs, each declared with `bounded` / `at_least`
(`blueprint._layer`), which give the default, the accepted range and a valid non-default `example`.
"""
import dataclasses

import blueprint
from planner.ops import ACTIVATIONS, KINDS_WITH_EXTRAS, OPS, SHAPE_PRESERVING, Prim

PARAMETERISED = tuple(prim for prim in Prim if prim in SHAPE_PRESERVING and OPS[prim].attrs
                      and prim not in KINDS_WITH_EXTRAS and hasattr(blueprint, prim.value))


def factory(prim):
    return getattr(blueprint, prim.value)   # each DSL factory is named as its kind


def record_fields(prim) -> tuple:
    record = factory(prim)().params
    return () if record is None else dataclasses.fields(record)


def examples(prim) -> dict:
    """A valid non-default value of each parameter, by name (the factory's keyword arguments)."""
    return {f.name: f.metadata["example"] for f in record_fields(prim)}


def defaults(prim) -> dict:
    return {f.name: f.default for f in record_fields(prim)}


def in_attrs_order(prim, values: dict) -> tuple:
    """``values`` (by name) as the reference and scalar pairs take them: positionally, in the row's attrs order."""
    return tuple(values[name] for name in OPS[prim].attrs)


ACTIVATION_EXAMPLES = {prim: in_attrs_order(prim, examples(prim)) for prim in ACTIVATIONS}
