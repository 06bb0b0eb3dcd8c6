"""The DSL: one table of every factory drives construction, validation, immutability, equality
and the repr round trip; Hypothesis trees check the same properties on random networks."""
import dataclasses
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import blueprint
from blueprint import (
    BlockStyle, BluePrint, Kind, Layer, add2, avgpool, block, bn, cbr, cbrp, channel_padding, conv, conv_dw,
    drop_path, dropout, fc, flatten, gap, gap_fc, group_conv, identity, leaky_relu, map_layers, maxpool, mbconv,
    named, relu, repeat, se, seq,
)
from planner.ops import ACTIVATIONS, OPS

from tests.support.kind_params import PARAMETERISED, defaults, examples, factory, record_fields  # noqa: E402

DSL_NAMESPACE: dict = {}
exec("from blueprint import *", DSL_NAMESPACE)

BODY = seq(conv(8, 3, 1, 1), bn(), relu())


def call(*args, **kwargs):
    return args, kwargs


def bad(exception, fragment, *args, **kwargs):
    return args, kwargs, exception, fragment


def _outside(spec):
    """A value just outside what the field accepts, and the start of the message naming the range."""
    if "int" in spec.metadata:
        return spec.metadata["int"] - 1, f"{spec.name} must be"
    low, high, low_open, high_open = spec.metadata["float"]
    value = (low if low_open else low - 0.5) if math.isfinite(low) else (high if high_open else high + 0.5)
    if not math.isfinite(value):
        return None, ""   # every finite float is accepted
    return value, f"{spec.name} must be in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}, got"


def parameterised_calls(prim):
    """Valid: the defaults, every parameter at its example (positionally and by name); invalid: each
    parameter just outside its range, and of the wrong type."""
    values = examples(prim)
    valid = [call(), call(*values.values())]   # distinct values (test_different_arguments_give_different_values)
    if len(values) > 1:   # one parameter changed by name, the rest default
        valid += [call(**{name: value}) for name, value in values.items()]
    invalid = []
    for spec in record_fields(prim):
        outside, fragment = _outside(spec)
        if outside is not None:
            invalid.append(bad(ValueError, fragment, **{spec.name: outside}))
        invalid.append(bad(TypeError, f"{spec.name} must be a", **{spec.name: "1"}))
    return valid, invalid


# factory -> (valid calls, invalid calls with the exception and a fragment of its message)
FACTORIES = {
    seq: ([call(relu()), call(BODY, gap(), fc(10)), call([conv(8, 1), [bn(), relu()]])],
          [bad(ValueError, "needs at least one layer", ), bad(ValueError, "needs at least one layer", []),
           bad(TypeError, "layer #1 must be a Layer", relu(), 3),
           bad(TypeError, "must be a Layer", [relu(), "relu"])]),
    add2: ([call(identity(), BODY), call(seq(conv(8, 1), bn()), BODY)],
           [bad(TypeError, "lhs must be a Layer", None, BODY), bad(TypeError, "rhs must be a Layer", BODY, [BODY])]),
    repeat: ([call(BODY, 1), call(block(16, BlockStyle.RESNET_3_3), 5)],
             [bad(ValueError, "times must be a positive int, got 0", BODY, 0),
              bad(ValueError, "times must be a positive int, got -2", BODY, -2),
              bad(TypeError, "times must be an int, got bool", BODY, True),
              bad(TypeError, "body must be a Layer", 3, 2)]),
    named: ([call("conv1", conv(64, 7, 2, 3)), call("layer1.0", BODY), call("features", seq(BODY, BODY))],
            [bad(ValueError, "dotted identifier", "", BODY), bad(ValueError, "dotted identifier", "1x", BODY),
             bad(ValueError, "dotted identifier", "a..b", BODY), bad(ValueError, "dotted identifier", 3, BODY),
             bad(TypeError, "body must be a Layer", "x", "relu")]),
    identity: ([call()], []),
    conv: ([call(8, 1), call(16, 3, 1, 1), call(64, 7, 2, 3), call(out_ch=32, k=5, s=2, p=4)],
           [bad(ValueError, "out_ch must be a positive int, got 0", 0, 3),
            bad(ValueError, "out_ch must be a positive int, got -8", -8, 3),
            bad(ValueError, "out_ch must be at most 2**31-1, got " + str(10**30), 10**30, 3),
            bad(ValueError, "k must be at most 2**31-1, got 2147483648", 8, 2**31),
            bad(ValueError, "k must be a positive int, got 0", 8, 0),
            bad(ValueError, "s must be a positive int, got 0", 8, 3, 0, 1),
            bad(ValueError, "p must be an int >= 0, got -1", 8, 3, 1, -1),
            bad(ValueError, "padding p=3 must be smaller than the kernel k=3", 8, 3, 1, 3),
            bad(TypeError, "out_ch must be an int, got bool", True, 3),
            bad(TypeError, "k must be an int, got float", 8, 3.0),
            bad(TypeError, "s must be an int, got bool", 8, 3, False)]),
    conv_dw: ([call(3), call(3, 1, 1), call(5, 2, 2)],
              [bad(ValueError, "k must be a positive int, got 0", 0),
               bad(ValueError, "s must be a positive int, got -1", 3, -1),
               bad(ValueError, "padding p=3 must be smaller", 3, 1, 3),
               bad(TypeError, "p must be an int, got bool", 3, 1, True)]),
    group_conv: ([call(64, 4, 3, 1, 1), call(32, 32, 3), call(8, 1, 1)],
                 [bad(ValueError, "out_ch=10 must be a multiple of groups=4", 10, 4, 3),
                  bad(ValueError, "groups must be a positive int, got 0", 8, 0, 3),
                  bad(ValueError, "out_ch must be a positive int", 0, 1, 3),
                  bad(ValueError, "padding p=1 must be smaller", 8, 2, 1, 1, 1),
                  bad(TypeError, "groups must be an int, got bool", 8, True, 3)]),
    bn: ([call(), call(0.2, 1e-3), call(momentum=1.0), call(eps=1)],
         [bad(ValueError, "momentum must be in [0.0, 1.0], got 1.5", momentum=1.5),
          bad(ValueError, "momentum must be in [0.0, 1.0], got -0.1", momentum=-0.1),
          bad(ValueError, "eps must be > 0, got 0.0", eps=0),
          bad(TypeError, "eps must be a finite float", eps=float("inf")),
          bad(TypeError, "momentum must be a finite float, got True", momentum=True)]),
    # every activation of the op table without parameters: a factory that takes none
    **{getattr(blueprint, kind.value): ([call()], []) for kind in ACTIVATIONS if not OPS[kind].attrs},
    # every parameterised kind (leaky_relu, elu, celu, softplus, prelu, ...): calls built from its record
    **{factory(prim): parameterised_calls(prim) for prim in PARAMETERISED},
    drop_path: ([call(0.2), call(0), call(0.999)],
                [bad(ValueError, "p must be in [0.0, 1.0), got 1.0", 1.0),
                 bad(TypeError, "p must be a finite float, got True", True)]),
    se: ([call(16), call(0.25), call(8, "hardsigmoid"), call(1.0, "sigmoid", "silu"), call(4, gate="hardsigmoid")],
         [bad(ValueError, "squeeze must be a positive int, got 0", 0),
          bad(ValueError, "a fractional squeeze must be in (0, 1], got 0.0", 0.0),
          bad(ValueError, "squeeze must be in [0.0, 1.0], got 1.5", 1.5),
          bad(ValueError, "gate must be one of 'sigmoid', 'hardsigmoid', got 'relu'", 8, "relu"),
          bad(ValueError, "act must be one of 'relu', 'silu', got 'gelu'", 8, "sigmoid", "gelu"),
          bad(TypeError, "gate must be one of 'sigmoid', 'hardsigmoid' (a str), got relu()", 8, relu()),
          bad(TypeError, "squeeze must be an int, got bool", True)]),
    dropout: ([call(0.5), call(0), call(0.999)],
              [bad(ValueError, "p must be in [0.0, 1.0), got 1.0", 1.0),
               bad(ValueError, "p must be in [0.0, 1.0), got -0.1", -0.1),
               bad(TypeError, "p must be a finite float, got nan", float("nan")),
               bad(TypeError, "p must be a finite float, got False", False)]),
    flatten: ([call()], []),
    fc: ([call(10), call(1, False), call(out=4096, bias=True)],
         [bad(ValueError, "out must be a positive int, got 0", 0),
          bad(TypeError, "out must be an int, got bool", True),
          bad(TypeError, "bias must be a bool, got 1", 10, 1)]),
    maxpool: ([call(2, 2), call(3, 2, 1), call(3, 1, 2)],
              [bad(ValueError, "k must be a positive int, got 0", 0, 1),
               bad(ValueError, "s must be a positive int, got 0", 2, 0),
               bad(ValueError, "p must be an int >= 0, got -1", 3, 2, -1),
               bad(ValueError, "padding p=2 must be smaller than the kernel k=2", 2, 2, 2)]),
    avgpool: ([call(2, 2), call(3, 1, 1)],
              [bad(ValueError, "padding p=3 must be smaller", 3, 1, 3),
               bad(TypeError, "k must be an int, got bool", True, 1)]),
    gap: ([call()], []),
    channel_padding: ([call(), call(4), call(1)],
                      [bad(ValueError, "multiple must be a positive int, got 0", 0),
                       bad(TypeError, "multiple must be an int, got bool", True)]),
    cbr: ([call(32, 3, 1, 1), call(16, 1, 2, 0), call(8, 3, 1, 1, 0.3, 1e-3)],
          [bad(ValueError, "out_ch must be a positive int, got 0", 0, 3, 1, 1),
           bad(ValueError, "padding p=1 must be smaller than the kernel k=1", 8, 1, 1, 1),
           bad(ValueError, "eps must be > 0", 8, 3, 1, 1, 0.1, 0.0),
           bad(TypeError, "s must be an int, got bool", 8, 3, True, 1)]),
    cbrp: ([call(32, 3, 1, 1, 2, 2, 0), call(8, 5, 1, 2, 3, 2, 1)],
           [bad(ValueError, "conv_k must be a positive int, got 0", 32, 0, 1, 0, 2, 2, 0),
            bad(ValueError, "pool_s must be a positive int, got 0", 32, 3, 1, 1, 2, 0, 0),
            bad(ValueError, "padding pool_p=2 must be smaller than the kernel pool_k=2", 32, 3, 1, 1, 2, 2, 2),
            bad(ValueError, "padding conv_p=3 must be smaller than the kernel conv_k=3", 32, 3, 1, 3, 2, 2, 0),
            bad(ValueError, "conv_p must be an int >= 0, got -1", 32, 3, 1, -1, 2, 2, 0)]),
    gap_fc: ([call(10), call(1000, False)],
             [bad(ValueError, "out must be a positive int, got -1", -1),
              bad(TypeError, "bias must be a bool", 10, None)]),
    block: ([call(64, 256, BlockStyle.RESNET_1_3_1), call(128, 512, BlockStyle.RESNET_1_3_1_DS),
             call(64, BlockStyle.RESNET_3_3), call(128, BlockStyle.RESNET_3_3_DS)],
            [bad(TypeError, "the last argument must be a BlockStyle"),
             bad(TypeError, "the last argument must be a BlockStyle", 64),
             bad(TypeError, "the last argument must be a BlockStyle", 64, "resnet_3_3"),
             bad(TypeError, "takes 2 channel argument(s) as block(mid_ch, out_ch, style), got 1",
                 64, BlockStyle.RESNET_1_3_1),
             bad(TypeError, "takes 2 channel argument(s)", 64, 64, 256, BlockStyle.RESNET_1_3_1_DS),
             bad(TypeError, "takes 1 channel argument(s) as block(out_ch, style), got 2",
                 64, 64, BlockStyle.RESNET_3_3),
             bad(TypeError, "takes 1 channel argument(s)", BlockStyle.RESNET_3_3_DS),
             bad(ValueError, "mid_ch must be a positive int, got 0", 0, 256, BlockStyle.RESNET_1_3_1),
             bad(ValueError, "out_ch must be a positive int, got -64", -64, BlockStyle.RESNET_3_3),
             bad(TypeError, "out_ch must be an int, got bool", True, BlockStyle.RESNET_3_3)]),
    mbconv: ([call(6, 24, 2), call(1, 16, 1), call(6, 96, 1, 5), call(6, 40, 2, 5, "silu", se(4, "sigmoid", "silu"), 0.1),
              call(1, 40, 2, 5, "hardswish", se(32, "hardsigmoid"), 0.0, 72, 0.01, 0.001),
              call(1, 24, 1, expanded_ch=88, act="relu")],
             [bad(ValueError, "expand_ratio must be a positive int, got 0", 0, 24, 1),
              bad(ValueError, "out_ch must be a positive int, got 0", 6, 0, 1),
              bad(ValueError, "stride must be 1 or 2, got 3", 6, 24, 3),
              bad(ValueError, "stride must be a positive int, got 0", 6, 24, 0),
              bad(ValueError, "k must be odd", 6, 24, 1, 4),
              bad(TypeError, "expand_ratio must be an int, got bool", True, 24, 1),
              bad(ValueError, "act must be one of 'relu6', 'relu', 'hardswish', 'silu', got 'gelu'", 6, 24, 1, 3, "gelu"),
              bad(TypeError, "se must be None or an se(...) layer, got relu()", 6, 24, 1, 3, "relu6", relu()),
              bad(ValueError, "drop_path must be in [0.0, 1.0), got 1.0", 6, 24, 1, 3, "relu6", None, 1.0),
              bad(ValueError, "give the expanded width either as expand_ratio (6) or as expanded_ch (72)", 6, 24, 1,
                  expanded_ch=72),
              bad(ValueError, "eps must be > 0", 1, 24, 1, eps=0.0)]),
}

VALID = [(factory, args, kwargs) for factory, (calls, _) in FACTORIES.items() for args, kwargs in calls]
INVALID = [(factory, *case) for factory, (_, cases) in FACTORIES.items() for case in cases]
VALID_IDS = [f"{f.__name__}{args}{kwargs or ''}" for f, args, kwargs in VALID]
INVALID_IDS = [f"{f.__name__}{args}{kwargs or ''}" for f, args, kwargs, _, _ in INVALID]

# different spellings of one value
EQUAL_SPELLINGS = [
    (conv(8, 1), conv(8, 1, 1, 0)),
    (conv(8, 3, 1, 1), conv(out_ch=8, k=3, s=1, p=1)),
    (bn(), bn(0.1, 1e-5)),
    (dropout(0), dropout(0.0)),
    (leaky_relu(), leaky_relu(0.01)),
    (fc(10), fc(10, True)),
    (cbr(8, 3, 1, 1), cbr(8, 3, 1, 1, 0.1, 1e-5)),
    (mbconv(6, 24, 2), mbconv(6, 24, 2, 3)),
    (mbconv(6, 24, 2), mbconv(6, 24, 2, 3, "relu6", None, 0.0, 0, 0.1, 1e-5)),
    (se(8), se(8, "sigmoid", "relu")),
    (drop_path(0), drop_path(0.0)),
    (seq(relu(), [bn(), [gap()]]), seq(relu(), bn(), gap())),
    (BluePrint(BODY, "a"), BluePrint(seq(conv(8, 3, 1, 1), bn(), relu()), "b")),  # the name is not compared
]


def test_the_table_covers_every_exported_factory():
    exported = {name for name in blueprint.__all__ if name.islower() and name not in ("zoo", "map_layers", "summary")}
    assert {f.__name__ for f in FACTORIES} == exported
    assert {f.__name__ for f in FACTORIES} == {kind.value for kind in Kind}


def test_the_table_covers_every_block_style_and_both_arities():
    styles = {args[-1] for f, args, _ in VALID if f is block}
    assert styles == set(BlockStyle)
    assert {len(args) for f, args, _ in VALID if f is block} == {2, 3}


@pytest.mark.parametrize("factory, args, kwargs", VALID, ids=VALID_IDS)
def test_valid_calls_build_a_layer_of_the_factory_kind(factory, args, kwargs):
    layer = factory(*args, **kwargs)
    assert isinstance(layer, Layer)
    assert layer.kind.value == factory.__name__
    assert isinstance(layer.children, tuple) and all(isinstance(c, Layer) for c in layer.children)


@pytest.mark.parametrize("factory, args, kwargs, exception, fragment", INVALID, ids=INVALID_IDS)
def test_invalid_calls_raise_naming_the_factory_and_the_argument(factory, args, kwargs, exception, fragment):
    with pytest.raises(exception, match=re.escape(fragment)) as caught:
        factory(*args, **kwargs)
    assert type(caught.value) is exception
    assert str(caught.value).startswith(f"{factory.__name__}(): ")


def _attributes(value) -> list[str]:
    return [f.name for f in dataclasses.fields(value)] + ["not_a_field"]


def _assert_immutable(value) -> None:
    for name in _attributes(value):
        # a frozen dataclass raises FrozenInstanceError (an AttributeError); CPython 3.11's
        # frozen+slots dataclasses raise TypeError for names that are not fields
        with pytest.raises((AttributeError, TypeError)):
            setattr(value, name, None)
        with pytest.raises((AttributeError, TypeError)):
            delattr(value, name)


@pytest.mark.parametrize("factory, args, kwargs", VALID, ids=VALID_IDS)
def test_layers_and_their_parameter_records_are_immutable(factory, args, kwargs):
    layer = factory(*args, **kwargs)
    _assert_immutable(layer)
    if layer.params is not None:
        _assert_immutable(layer.params)
    assert layer == factory(*args, **kwargs)


def test_a_blueprint_is_immutable():
    bp = BluePrint(BODY, "net")
    _assert_immutable(bp)
    assert bp.root is BODY and bp.name == "net"


@pytest.mark.parametrize("factory, args, kwargs", VALID, ids=VALID_IDS)
def test_equal_arguments_give_equal_values_with_equal_hashes(factory, args, kwargs):
    first, second = factory(*args, **kwargs), factory(*args, **kwargs)
    assert first == second and hash(first) == hash(second)


def test_different_arguments_give_different_values():
    values = [factory(*args, **kwargs) for factory, args, kwargs in VALID]
    for i, a in enumerate(values):
        for j, b in enumerate(values):
            assert (a == b) == (i == j), f"{VALID_IDS[i]} vs {VALID_IDS[j]}"
    assert len(set(values)) == len(values)


@pytest.mark.parametrize("first, second", EQUAL_SPELLINGS, ids=lambda v: repr(v))
def test_different_spellings_of_one_value_are_equal(first, second):
    assert first == second and hash(first) == hash(second) and repr(first) == repr(second)


@pytest.mark.parametrize("factory, args, kwargs", VALID, ids=VALID_IDS)
def test_repr_is_dsl_code_that_evaluates_back(factory, args, kwargs):
    layer = factory(*args, **kwargs)
    text = repr(layer)
    assert text.startswith(factory.__name__ + "(")
    again = eval(text, dict(DSL_NAMESPACE))
    assert again == layer and hash(again) == hash(layer) and repr(again) == text
    bp = BluePrint(layer, "net")
    assert eval(repr(bp), dict(DSL_NAMESPACE)) == bp


def test_blueprint_root_must_be_a_layer_and_empty_blueprints_print():
    with pytest.raises(TypeError, match=r"BluePrint\(root\): expected a Layer, got str"):
        BluePrint("seq()")
    assert BluePrint().empty and repr(BluePrint()) == "BluePrint()"
    assert eval("BluePrint()", dict(DSL_NAMESPACE)) == BluePrint()
    assert list(BluePrint().walk()) == []


def test_walk_names_dsl_paths_parents_first():
    root = seq(named("stem", conv(8, 3, 1, 1)), add2(identity(), seq(bn(), relu())), repeat(relu(), 2))
    assert [path for path, _ in root.walk()] == [
        "seq", "seq[0].named", "seq[0].named.conv", "seq[1].add2", "seq[1].add2.lhs", "seq[1].add2.rhs",
        "seq[1].add2.rhs[0].bn", "seq[1].add2.rhs[1].relu", "seq[2].repeat", "seq[2].repeat.relu"]


def test_repeat_stores_its_body_once():
    body = block(16, BlockStyle.RESNET_3_3)
    assert repeat(body, 5).children == (body,)


# ---- random trees ------------------------------------------------------------------------
# A recipe is (factory name, args) with child recipes among the args; building it twice gives
# two separate object trees that must be equal values.
small = st.integers(1, 64)
window = st.integers(1, 7).flatmap(lambda k: st.tuples(st.just(k), st.integers(1, 3), st.integers(0, k - 1)))
unit_open = st.floats(0.0, 1.0, exclude_max=True, allow_nan=False)
LEAVES = st.one_of(
    st.tuples(st.just("identity"), st.just(())),
    st.tuples(st.just("conv"), st.tuples(small, window).map(lambda a: (a[0], *a[1]))),
    st.tuples(st.just("conv_dw"), window),
    st.tuples(st.just("group_conv"), st.tuples(st.integers(1, 8), st.integers(1, 8), window)
              .map(lambda a: (a[0] * a[1], a[1], *a[2]))),
    st.tuples(st.just("bn"), st.tuples(st.floats(0.0, 1.0), st.floats(1e-8, 1.0))),
    st.tuples(st.sampled_from([kind.value for kind in ACTIVATIONS if not OPS[kind].attrs] + ["flatten", "gap"]),
              st.just(())),
    # every parameterised kind of the op table, at its defaults or its examples
    st.sampled_from(PARAMETERISED).flatmap(lambda prim: st.tuples(
        st.just(prim.value), st.sampled_from([tuple(defaults(prim).values()), tuple(examples(prim).values())]))),
    st.tuples(st.just("drop_path"), st.tuples(unit_open)),
    st.tuples(st.just("se"), st.tuples(st.one_of(small, st.floats(0.01, 1.0)), st.sampled_from(["sigmoid", "hardsigmoid"]),
                                       st.sampled_from(["relu", "silu"]))),
    st.tuples(st.just("dropout"), st.tuples(unit_open)),
    st.tuples(st.sampled_from(["fc", "gap_fc"]), st.tuples(small, st.booleans())),
    st.tuples(st.sampled_from(["maxpool", "avgpool"]), window),
    st.tuples(st.just("channel_padding"), st.tuples(st.integers(1, 16))),
    st.tuples(st.just("cbr"), st.tuples(small, window).map(lambda a: (a[0], *a[1]))),
    st.tuples(st.just("cbrp"), st.tuples(small, window, window).map(lambda a: (a[0], *a[1], *a[2]))),
    st.tuples(st.just("block"), st.one_of(
        st.tuples(small, small, st.sampled_from([BlockStyle.RESNET_1_3_1, BlockStyle.RESNET_1_3_1_DS])),
        st.tuples(small, st.sampled_from([BlockStyle.RESNET_3_3, BlockStyle.RESNET_3_3_DS])))),
    st.tuples(st.just("mbconv"), st.tuples(st.integers(1, 6), small, st.sampled_from([1, 2]),
                                           st.sampled_from([1, 3, 5, 7]))),
    st.tuples(st.just("mbconv"), st.tuples(st.just(1), small, st.sampled_from([1, 2]), st.sampled_from([3, 5]),
                                           st.sampled_from(["relu", "hardswish", "silu"]),
                                           st.one_of(st.none(), st.builds(se, small, st.just("hardsigmoid"))),
                                           unit_open, small, st.floats(0.0, 1.0), st.floats(1e-8, 1.0))),
)
NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,6}(\.[0-9]{1,2})?", fullmatch=True)


def _containers(children):
    return st.one_of(
        st.tuples(st.just("seq"), st.lists(children, min_size=1, max_size=4).map(tuple)),
        st.tuples(st.just("add2"), st.tuples(children, children)),
        st.tuples(st.just("repeat"), st.tuples(children, st.integers(1, 5))),
        st.tuples(st.just("named"), st.tuples(NAMES, children)),
    )


RECIPES = st.recursive(LEAVES, _containers, max_leaves=16)


def _is_recipe(value) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], tuple)


def build(recipe) -> Layer:
    name, args = recipe
    return DSL_NAMESPACE[name](*(build(a) if _is_recipe(a) else a for a in args))


def _node_count(layer: Layer) -> int:
    return 1 + sum(_node_count(child) for child in layer.children)


def _rebuild(layer: Layer) -> Layer:
    return Layer(layer.kind, layer.params, tuple(_rebuild(child) for child in layer.children))


@settings(max_examples=150, deadline=None)
@given(RECIPES)
def test_random_trees_round_trip_through_repr(recipe):
    tree = build(recipe)
    twin = build(recipe)
    assert tree == twin and hash(tree) == hash(twin) and repr(tree) == repr(twin)
    again = eval(repr(tree), dict(DSL_NAMESPACE))
    assert again == tree and hash(again) == hash(tree) and repr(again) == repr(tree)
    bp = BluePrint(tree)
    assert eval(repr(bp), dict(DSL_NAMESPACE)) == bp
    assert _rebuild(tree) == tree
    assert map_layers(tree, lambda layer: layer) == tree


@settings(max_examples=100, deadline=None)
@given(RECIPES)
def test_random_trees_cannot_be_mutated(recipe):
    bp = BluePrint(build(recipe), "random")
    _assert_immutable(bp)
    for _, layer in bp.walk():
        _assert_immutable(layer)
        if layer.params is not None:
            _assert_immutable(layer.params)


@settings(max_examples=150, deadline=None)
@given(RECIPES)
def test_walk_visits_every_node_and_pretty_prints_one_line_each(recipe):
    tree = build(recipe)
    visited = list(tree.walk())
    assert len(visited) == _node_count(tree)
    assert visited[0] == (tree.kind.value, tree)
    assert len({path for path, _ in visited}) == len(visited)
    lines = tree.pretty().split("\n")
    assert len(lines) == len(visited)
    for line, (depth, layer) in zip(lines, _preorder_depths(tree)):
        assert line.startswith("  " * depth) and line[2 * depth] != " "
        if not layer.children:
            assert line[2 * depth:] == repr(layer)
    assert BluePrint(tree, "net").pretty().split("\n")[0] == "BluePrint net"
    assert len(BluePrint(tree).pretty().split("\n")) == len(visited) + 1


def _preorder_depths(layer: Layer, depth: int = 0):
    yield depth, layer
    for child in layer.children:
        yield from _preorder_depths(child, depth + 1)


def test_hardtanh_refuses_an_empty_range():
    """The one check between two parameters, which the records' per-field ranges cannot state."""
    with pytest.raises(ValueError, match=r"hardtanh\(\): min_val must be smaller than max_val, got 1.0 and 1.0"):
        blueprint.hardtanh(1.0, 1.0)
    assert blueprint.hardtanh(-2.0, -1.5) == blueprint.hardtanh(min_val=-2.0, max_val=-1.5)
