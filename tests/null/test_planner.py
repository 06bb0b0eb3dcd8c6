"""The planner end to end: the compiled expander against its own source run uncompiled, every zoo
model and random well-formed trees through compile + verify, and verify() catching corrupted plans.

Random trees come from `networks()`, a strategy that tracks the value's channels, spatial size
and rank while it draws, so every tree it makes is valid by construction (the test that
compiles them is the proof). `LOOSE_TREES` makes arbitrary, mostly invalid trees: the twins
must fail on them with the same error.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, replace
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blueprint
import planner
import planner.compiler
import planner.expand
from blueprint import (
    BlockStyle, BluePrint, Layer, add2, avgpool, block, bn, cbr, cbrp, channel_padding, conv, conv_dw, drop_path,
    dropout, fc, flatten, gap, gap_fc, gelu, group_conv, identity, leaky_relu, maxpool, mbconv, named, relu, repeat,
    se, seq, zoo,
)
from planner import ArchPlan, ExpandError
from planner._build import is_compiled, source
from planner import ops
from planner.compiler import Compiler
from planner.ops import ShapeError
from planner.plan import Role
from planner.schedule import size_slot
from planner.verify import PlanError

# The twins: `planner._expand` as imported (the compiled extension where it is built) and the same
# `_expand.py` loaded uncompiled under another module name (the oracle).
_expand_c, _expand_py = importlib.import_module("planner._expand"), source("planner._expand")
TWINS = {"cython": _expand_c.expand_tree, "pure": _expand_py.expand_tree}
needs_build = pytest.mark.skipif(not is_compiled(_expand_c), reason=(
    "planner._expand is not compiled, so there is no compiled twin to check: "
    "run `python setup.py build_ext --inplace` (or `pip install -e .`)"))
FUSE_MODES = [pytest.param(dict(fuse=False), id="unfused"), pytest.param(dict(fuse=True, amp=True), id="fused")]


def arch_with(name: str, bp: BluePrint, **options) -> ArchPlan:
    """`ArchPlan.from_blueprint` with the named expander twin."""
    with mock.patch.object(planner.expand, "_expander", lambda: TWINS[name]):
        return ArchPlan.from_blueprint(bp, **options)


def outcome(fn):
    """What `fn()` returns, or the type and message of what it raises (the twins must agree on both)."""
    try:
        return "ok", fn()
    except Exception as error:  # noqa: BLE001 - any disagreement is a failure
        return type(error), str(error)


# ---- random well-formed networks ----------------------------------------------------------------
@dataclass(frozen=True)
class Value:
    """What flows between layers while drawing: rank 4 (channels, square spatial size) or rank 2 (features)."""

    rank: int
    channels: int
    size: int = 1


SE_GATES = ("sigmoid", "hardsigmoid")
ACTIVATIONS = tuple(getattr(blueprint, kind.value) for kind in ops.ACTIVATIONS if not ops.OPS[kind].attrs)


class Draw:
    """Draws one network. `aligned` keeps every width a multiple of 8 (what fused fp16 kernels need);
    names come from a counter so no two `named` scopes collide."""

    def __init__(self, draw, aligned: bool):
        self.draw, self.aligned, self.names = draw, aligned, 0

    def width(self) -> int:
        return self.draw(st.sampled_from((8, 16, 24))) if self.aligned else self.draw(st.integers(1, 12))

    def window(self, size: int, preserve: bool) -> tuple[int, int, int]:
        """(k, s, p) that fits `size`; with `preserve` an odd kernel, stride 1 and same padding."""
        if preserve:
            k = self.draw(st.sampled_from((1, 3, 5)))
            return k, 1, (k - 1) // 2
        k = self.draw(st.integers(1, 5))
        s = self.draw(st.integers(1, 3))
        p = max(self.draw(st.integers(0, k - 1)), -(-(k - size) // 2))
        return k, s, p

    def name(self) -> str:
        self.names += 1
        return f"n{self.names}"

    # -- rank 4 --
    def leaf4(self, x: Value, preserve: bool, exact: bool) -> tuple[Layer, Value]:
        """One NHWC leaf or composite node. `preserve`: its output does not change when it is applied
        again (so it can be repeated); `exact`: output == input (so it can be a residual branch)."""
        options = ["bn", "act", "dropout", "identity", "conv", "conv_dw", "pool", "cbr", "block", "mbconv",
                   "group_conv", "channel_padding", "cbrp", "se", "drop_path"]
        choice = self.draw(st.sampled_from(options))
        width = x.channels if exact else self.width()
        if choice == "bn":
            return bn(), x
        if choice == "act":
            if self.draw(st.booleans()):
                return leaky_relu(self.draw(st.sampled_from((0.0, 0.1, 0.2)))), x
            return self.draw(st.sampled_from(ACTIVATIONS))(), x
        if choice == "dropout":
            return dropout(self.draw(st.sampled_from((0.0, 0.25, 0.5)))), x
        if choice == "identity":
            return identity(), x
        if choice == "se":
            return se(self.draw(st.sampled_from((1, 2, 0.25, 1.0))), self.draw(st.sampled_from(SE_GATES)),
                      self.draw(st.sampled_from(("relu", "silu")))), x
        if choice == "drop_path":
            return drop_path(self.draw(st.sampled_from((0.0, 0.2)))), x
        k, s, p = self.window(x.size, preserve or exact)
        size = (x.size + 2 * p - k) // s + 1
        if choice == "conv":
            return conv(width, k, s, p), Value(4, width, size)
        if choice == "conv_dw":
            return conv_dw(k, s, p), Value(4, x.channels, size)
        if choice == "pool":
            pool = self.draw(st.sampled_from((maxpool, avgpool)))
            return pool(k, s, p), Value(4, x.channels, size)
        if choice == "cbr":
            return cbr(width, k, s, p), Value(4, width, size)
        if choice == "group_conv":
            groups = self.draw(st.sampled_from([g for g in (1, 2, 4, 8) if x.channels % g == 0]))
            out = x.channels if exact else groups * self.draw(st.integers(1, 3)) * (8 // groups if self.aligned else 1)
            return group_conv(out, groups, k, s, p), Value(4, out, size)
        if choice == "channel_padding":
            multiple = self.draw(st.sampled_from((1, 2, 4, 8)))
            out = -(-x.channels // multiple) * multiple
            if exact and out != x.channels:
                return identity(), x
            return channel_padding(multiple), Value(4, out, x.size)
        if choice == "cbrp":
            pk, ps, pp = self.window(size, preserve or exact)
            pooled = (size + 2 * pp - pk) // ps + 1
            return cbrp(width, k, s, p, pk, ps, pp), Value(4, width, pooled)
        stride = 1 if preserve or exact else self.draw(st.sampled_from((1, 2)))
        out_size = (x.size - 1) // stride + 1
        if choice == "block":
            if self.draw(st.booleans()):
                style = BlockStyle.RESNET_1_3_1_DS if stride == 2 else BlockStyle.RESNET_1_3_1
                return block(self.width(), width, style), Value(4, width, out_size)
            style = BlockStyle.RESNET_3_3_DS if stride == 2 else BlockStyle.RESNET_3_3
            return block(width, style), Value(4, width, out_size)
        ratio = self.draw(st.sampled_from((1, 2, 6)))
        k = self.draw(st.sampled_from((1, 3, 5)))
        if self.draw(st.booleans()):   # the MobileNetV2 form
            return mbconv(ratio, width, stride, k), Value(4, width, out_size)
        gate = se(self.draw(st.sampled_from((1, 4, 0.25))), self.draw(st.sampled_from(SE_GATES))) \
            if self.draw(st.booleans()) else None
        act = self.draw(st.sampled_from(("relu6", "relu", "hardswish", "silu")))
        return mbconv(ratio, width, stride, k, act, gate, self.draw(st.sampled_from((0.0, 0.2)))), \
            Value(4, width, out_size)

    def body4(self, x: Value, depth: int, preserve: bool = False, exact: bool = False) -> tuple[Layer, Value]:
        kind = self.draw(st.sampled_from(("leaf", "leaf", "seq", "add2", "repeat", "named") if depth else ("leaf",)))
        if kind == "leaf":
            return self.leaf4(x, preserve, exact)
        if kind == "seq":
            children = []
            for _ in range(self.draw(st.integers(1, 3))):
                child, x = self.body4(x, depth - 1, preserve, exact)
                children.append(child)
            return seq(*children), x
        if kind == "add2":
            main, y = self.body4(x, depth - 1, preserve, exact)
            return add2(self.shortcut(x, y, main, depth), main), y
        if kind == "repeat":   # a body repeated must map its input to itself: with `preserve` alone, a body whose
            # first node was drawn for x (an add2 whose shortcut keeps x's channels) met its own output the second time
            times = self.draw(st.integers(1, 3))
            body, y = self.body4(x, depth - 1, preserve=True, exact=exact or times > 1)
            return repeat(body, times), y
        body, y = self.body4(x, depth - 1, preserve, exact)
        return named(self.name(), body), y

    def shortcut(self, x: Value, y: Value, main: Layer, depth: int) -> Layer:
        """A branch from `x` that ends where the main branch does (`y`)."""
        if x == y:
            return identity() if self.draw(st.booleans()) else self.body4(x, depth - 1, exact=True)[0]
        for stride in range(1, x.size + 1):
            if (x.size - 1) // stride + 1 == y.size:
                return conv(y.channels, 1, stride, 0)
        return main  # the same subtree gives the same shape

    # -- the head and rank 2 --
    def head(self, x: Value) -> tuple[Layer, Value]:
        kind = self.draw(st.sampled_from(("gap_fc", "gap+fc", "flatten+fc", "fc")))
        out = self.draw(st.integers(2, 12))
        bias = self.draw(st.booleans())
        if kind == "gap_fc":
            return gap_fc(out, bias), Value(2, out)
        if kind == "gap+fc":
            return seq(gap(), fc(out, bias)), Value(2, out)
        if kind == "flatten+fc":
            return seq(flatten(), fc(out, bias)), Value(2, out)
        return fc(out, bias), Value(2, out)

    def body2(self, x: Value, depth: int) -> tuple[Layer, Value]:
        kind = self.draw(st.sampled_from(("bn", "act", "dropout", "fc", "flatten", "add2", "named")))
        if kind == "bn":
            return bn(), x
        if kind == "act":
            return self.draw(st.sampled_from(ACTIVATIONS))(), x
        if kind == "dropout":
            return dropout(0.5), x
        if kind == "flatten":
            return flatten(), x
        if kind == "fc" or not depth:
            out = self.draw(st.integers(2, 12))
            return fc(out), Value(2, out)
        if kind == "add2":
            main, y = self.body2(x, depth - 1)
            return add2(identity() if x == y else fc(y.channels), main), y
        body, y = self.body2(x, depth - 1)
        return named(self.name(), body), y


@st.composite
def networks(draw, aligned: bool = False):
    """(BluePrint, in_channels, input spatial size) of a valid network."""
    d = Draw(draw, aligned)
    channels = draw(st.sampled_from((8, 16))) if aligned else draw(st.integers(1, 4))
    size = draw(st.sampled_from((1, 4, 7, 8, 12)))
    x = Value(4, channels, size)
    parts = []
    for _ in range(draw(st.integers(0, 3))):
        part, x = d.body4(x, depth=draw(st.integers(0, 3)))
        parts.append(part)
    part, x = d.head(x)
    parts.append(part)
    for _ in range(draw(st.integers(0, 2))):
        part, x = d.body2(x, depth=1)
        parts.append(part)
    return BluePrint(seq(*parts)), channels, size


# Arbitrary trees, mostly invalid: leaves in any order at any rank.
SMALL = st.integers(1, 9)
WINDOW = st.integers(1, 4).flatmap(lambda k: st.tuples(st.just(k), st.integers(1, 2), st.integers(0, k - 1)))
LOOSE_LEAVES = st.one_of(
    st.builds(lambda a: conv(a[0], *a[1]), st.tuples(SMALL, WINDOW)),
    st.builds(lambda w: conv_dw(*w), WINDOW),
    st.builds(lambda g, m, w: group_conv(g * m, g, *w), st.integers(1, 3), st.integers(1, 3), WINDOW),
    st.builds(lambda w: maxpool(*w), WINDOW),
    st.builds(bn), st.builds(relu), st.builds(gelu), st.builds(identity), st.builds(flatten), st.builds(gap),
    st.builds(lambda o: fc(o), SMALL), st.builds(lambda o: gap_fc(o), SMALL),
    st.builds(lambda m: channel_padding(m), st.integers(1, 8)),
    st.builds(lambda o, w: cbr(o, *w), SMALL, WINDOW),
    st.builds(lambda o, w, v: cbrp(o, *w, *v), SMALL, WINDOW, WINDOW),
    st.builds(lambda o, s: block(o, s), SMALL, st.sampled_from([BlockStyle.RESNET_3_3, BlockStyle.RESNET_3_3_DS])),
    st.builds(lambda m, o, s: block(m, o, s), SMALL, SMALL,
              st.sampled_from([BlockStyle.RESNET_1_3_1, BlockStyle.RESNET_1_3_1_DS])),
    st.builds(lambda t, o, s, k: mbconv(t, o, s, k), st.integers(1, 6), SMALL, st.sampled_from([1, 2]),
              st.sampled_from([1, 3])),
)
LOOSE_TREES = st.recursive(LOOSE_LEAVES, lambda children: st.one_of(
    st.lists(children, min_size=1, max_size=4).map(lambda c: seq(*c)),
    st.builds(add2, children, children),
    st.builds(repeat, children, st.integers(1, 3)),
    st.builds(named, st.sampled_from(["a", "b", "layer1", "fc"]), children),
), max_leaves=12)


# ---- twins --------------------------------------------------------------------------------------
def test_the_oracle_is_the_source_uncompiled_never_the_extension():
    """Every twin test below compares two different modules: were the oracle the module under test,
    they would all pass vacuously."""
    assert _expand_py is not _expand_c and _expand_py.expand_tree is not _expand_c.expand_tree
    assert not is_compiled(_expand_py) and _expand_py.__name__ == "planner._expand_source"
    assert _expand_py.__file__ == str(Path(planner.__file__).with_name("_expand.py"))
    assert _expand_c.__name__ == "planner._expand"


@needs_build
def test_the_compiled_twin_is_the_extension_built_from_that_source():
    assert is_compiled(_expand_c) and not _expand_c.__file__.endswith(".py")
    assert Path(_expand_c.__file__).parent == Path(_expand_py.__file__).parent
    assert Path(_expand_c.__file__).name.split(".")[0] == "_expand"


@needs_build
@pytest.mark.parametrize("name", zoo.MODELS)
def test_twins_give_identical_records_on_the_zoo(name):
    entry = zoo.MODELS[name]
    root, channels = entry.build().root, entry.input_shape[2]
    compiled, pure = _expand_c.expand_tree(root, channels), _expand_py.expand_tree(root, channels)
    assert compiled == pure
    assert [tuple(map(type, r)) for r in compiled] == [tuple(map(type, r)) for r in pure]


@needs_build
@pytest.mark.parametrize("options", FUSE_MODES)
@pytest.mark.parametrize("name", zoo.MODELS)
def test_twins_give_identical_arch_plans_on_the_zoo(name, options):
    entry = zoo.MODELS[name]
    bp, channels = entry.build(), entry.input_shape[2]
    compiled = arch_with("cython", bp, in_channels=channels, **options)
    assert compiled == arch_with("pure", bp, in_channels=channels, **options)
    assert compiled.describe() == arch_with("pure", bp, in_channels=channels, **options).describe()


@needs_build
def test_the_environment_variable_selects_the_twin(monkeypatch):
    monkeypatch.setenv("BLUEPRINT_PURE_PYTHON", "1")
    assert planner.expand._expander() is _expand_py.expand_tree
    monkeypatch.delenv("BLUEPRINT_PURE_PYTHON")
    assert planner.expand._expander() is _expand_c.expand_tree


@needs_build
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(networks(), networks(aligned=True)), st.booleans())
def test_twins_agree_on_random_networks(network, fuse):
    bp, channels, _ = network
    assert _expand_c.expand_tree(bp.root, channels) == _expand_py.expand_tree(bp.root, channels)
    options = dict(in_channels=channels, fuse=fuse, amp=fuse)
    assert outcome(lambda: arch_with("cython", bp, **options)) == outcome(lambda: arch_with("pure", bp, **options))


@needs_build
@settings(max_examples=200, deadline=None)
@given(LOOSE_TREES, st.integers(1, 9))
def test_twins_fail_alike_on_arbitrary_trees(root, channels):
    compiled = outcome(lambda: _expand_c.expand_tree(root, channels))
    assert compiled == outcome(lambda: _expand_py.expand_tree(root, channels))
    bp = BluePrint(root)
    for options in (dict(), dict(fuse=True, amp=True)):
        assert (outcome(lambda: arch_with("cython", bp, in_channels=channels, **options))
                == outcome(lambda: arch_with("pure", bp, in_channels=channels, **options)))


@needs_build
def test_the_twins_raise_the_same_expand_errors():
    bad = seq(conv(8, 3, 1, 1), gap(), conv(8, 3, 1, 1), fc(10))
    messages = {name: outcome(lambda: fn(bad, 3)) for name, fn in TWINS.items()}
    assert messages["cython"] == messages["pure"]
    assert messages["cython"][0] is ExpandError and "seq[2].conv: conv needs an NHWC (4-D) input" in messages["cython"][1]


# ---- compile + verify ---------------------------------------------------------------------------
@pytest.mark.parametrize("options", FUSE_MODES)
@pytest.mark.parametrize("name", zoo.MODELS)
def test_every_zoo_model_compiles_and_verifies(name, options):
    entry = zoo.MODELS[name]
    arch = ArchPlan.from_blueprint(entry.build(), in_channels=entry.input_shape[2], **options)
    plan = Compiler(arch).compile({"train": (2, *entry.input_shape), "train_last": (1, *entry.input_shape),
                                   "eval": (3, *entry.input_shape)})
    plan.verify()
    assert set(plan.graphs) == {"train", "eval"}
    assert plan.variants["train"].signature != plan.variants["train_last"].signature
    assert plan.memory.train.transient_planned_bytes >= plan.memory.train.transient_lower_bound_bytes > 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(networks(), st.integers(1, 3))
def test_random_networks_compile_and_verify(network, batch):
    bp, channels, size = network
    plan = Compiler(ArchPlan.from_blueprint(bp, in_channels=channels)).compile(
        {"train": (batch + 1, size, size, channels), "eval": (batch, size, size, channels)})
    plan.verify()
    assert plan.tensor(plan.io["logits"]).shape_in("eval")[0] == batch


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(networks(aligned=True))
def test_random_aligned_networks_compile_fused_and_verify(network):
    bp, channels, size = network
    unfused = ArchPlan.from_blueprint(bp, in_channels=channels, amp=True)
    fused = ArchPlan.from_blueprint(bp, in_channels=channels, fuse=True, amp=True)
    plans = [Compiler(arch).compile({"train": (2, size, size, channels)}) for arch in (unfused, fused)]
    for plan in plans:
        plan.verify()
    assert [(p.name, p.shape) for p in plans[0].params] == [(p.name, p.shape) for p in plans[1].params]
    primitives = [replace(l, first=False) for layer in fused.layers for l in (layer.sub or (layer,))]
    assert primitives == [replace(l, first=False) for l in unfused.layers]


@pytest.mark.parametrize("root", [seq(conv(4, 3, 1, 1), add2(identity(), identity()), gap(), fc(3)),
                                  seq(fc(4), add2(identity(), flatten()))], ids=["nhwc", "features"])
def test_add2_of_one_value_twice_verifies(root):
    """add(x, x): one backward op writes dx = dy through role da, then adds dy again through role db,
    reading no gradient that an earlier op did not write."""
    plan = Compiler(ArchPlan.from_blueprint(BluePrint(root))).compile({"train": (2, 4, 4, 3)})
    plan.verify()
    add = next(op for op in plan.graphs["train"].ops if op.kind == "add" and op.direction == "backward")
    assert add.written(Role.DA) == add.written(Role.DB) is not None
    assert (add.writing(Role.DA).accumulate, add.writing(Role.DB).accumulate) == (False, True)
    assert [operand.role for operand in add.reads] == [Role.DY]


def test_add2_of_one_value_twice_accumulates_onto_an_earlier_gradient():
    """y = x + x inside z = x + y: the outer add's backward writes x's gradient first, so both roles of
    the inner add accumulate onto it and read it."""
    root = seq(fc(4), add2(identity(), add2(identity(), identity())), fc(3))
    plan = Compiler(ArchPlan.from_blueprint(BluePrint(root))).compile({"train": (2, 1, 1, 3)})
    plan.verify()
    outer, inner = [op for op in plan.graphs["train"].ops if op.kind == "add" and op.direction == "backward"]
    gradient = outer.written(Role.DA)
    assert inner.written(Role.DA) == inner.written(Role.DB) == gradient
    assert (inner.writing(Role.DA).accumulate, inner.writing(Role.DB).accumulate) == (True, True)
    assert inner.read(Role.DA) == inner.read(Role.DB) == gradient


@pytest.mark.parametrize("root", [repeat(identity(), 2), seq(identity(), named("a", identity()))])
def test_a_network_of_only_identities_raises_a_clear_error(root):
    with pytest.raises(ExpandError, match=r"must end with \(N, classes\) logits, but it has no layers") as caught:
        ArchPlan.from_blueprint(BluePrint(root))
    assert "fc(classes)" in str(caught.value)


@pytest.mark.parametrize("enabled_before", [True, False])
def test_a_compile_leaves_the_cyclic_gc_as_it_found_it(enabled_before):
    """The compile pauses the cyclic collector; afterwards (and after a failing compile) it is on again
    only if it was on before."""
    import gc

    arch = ArchPlan.from_blueprint(BluePrint(seq(conv(8, 3, 1, 1), relu(), gap(), fc(4, True))))
    observed = []
    real_infer_shapes = planner.compiler.infer_shapes

    def spy(*args):
        observed.append(gc.isenabled())
        return real_infer_shapes(*args)

    (gc.enable if enabled_before else gc.disable)()
    try:
        with mock.patch.object(planner.compiler, "infer_shapes", spy):
            Compiler(arch).compile({"train": (2, 8, 8, 3)})
        assert observed == [False] and gc.isenabled() is enabled_before
        with pytest.raises(ShapeError):
            Compiler(arch).compile({"train": (2, 8, 8, 5)})   # 5 input channels: refused inside the pause
        assert gc.isenabled() is enabled_before
    finally:
        gc.enable()


def test_a_slot_takes_the_largest_variant():
    """Phase 2 alone: the slot's shape and element count are the largest variant's, whatever the order."""
    shapes = {"train_last": (3, 4, 4, 8), "train": (5, 4, 4, 8), "train_small": (5, 2, 2, 8)}
    assert size_slot(shapes) == ((5, 4, 4, 8), 640, tuple(sorted(shapes.items())))
    assert size_slot([16, 3, 3, 8]) == ((16, 3, 3, 8), 1152, ())


# ---- verify() catches corrupt plans -------------------------------------------------------------
@pytest.fixture(scope="module")
def resnet_plan():
    arch = ArchPlan.from_blueprint(zoo.resnet20())
    plan = Compiler(arch).compile({"train": (4, 32, 32, 3), "eval": (2, 32, 32, 3)})
    plan.verify()
    return plan


def with_tensor(plan, tid, **changes):
    tensors = list(plan.tensors)
    tensors[tid] = tensors[tid]._replace(**changes)
    return dataclasses.replace(plan, tensors=tuple(tensors))


def spans(graph):
    span = {}
    for op in graph.ops:
        for operand in op.reads + op.writes:
            span.setdefault(operand.tensor, [op.index, op.index])[1] = op.index
    return span


def test_verify_catches_two_live_transients_sharing_memory(resnet_plan):
    span = spans(resnet_plan.graphs["train"])
    transients = [t for t in resnet_plan.tensors if t.graph == "train" and t.region == "transient" and t.nbytes]
    a, b = next((a, b) for a in transients for b in transients
                if a.id != b.id and a.nbytes <= b.nbytes and span[a.id][0] <= span[b.id][1] and span[b.id][0] <= span[a.id][1])
    with pytest.raises(PlanError, match="overlap while both are live") as caught:
        with_tensor(resnet_plan, a.id, offset=b.offset).verify()
    assert a.name in str(caught.value) and b.name in str(caught.value)


def test_verify_catches_a_dropped_write(resnet_plan):
    graph = resnet_plan.graphs["train"]
    op = next(op for op in graph.ops if op.direction == "forward" and op.kind == "relu")
    tid = op.written(Role.Y)
    ops = list(graph.ops)
    ops[op.index] = op._replace(writes=tuple(w for w in op.writes if w.role != Role.Y))
    corrupt = dataclasses.replace(resnet_plan, graphs={**resnet_plan.graphs, "train": replace(graph, ops=tuple(ops))})
    with pytest.raises(PlanError, match="before any op wrote it") as caught:
        corrupt.verify()
    assert resnet_plan.tensor(tid).name in str(caught.value)


def test_verify_catches_a_slot_too_small_for_a_variant(resnet_plan):
    t = next(t for t in resnet_plan.tensors if t.graph == "train" and t.region == "saved")
    with pytest.raises(PlanError, match="does not fit its slot"):
        with_tensor(resnet_plan, t.id, nbytes=t.nbytes // 2).verify()


def test_verify_catches_a_tensor_outside_its_region(resnet_plan):
    t = next(t for t in resnet_plan.tensors if t.region == "transient")
    start, size = resnet_plan.memory.regions["transient"]
    with pytest.raises(PlanError, match="leaves its region transient"):
        with_tensor(resnet_plan, t.id, offset=start + size).verify()


def test_verify_catches_overlapping_parameters(resnet_plan):
    first, second = (p.tensor for p in resnet_plan.params[:2])
    with pytest.raises(PlanError, match="overlap"):
        with_tensor(resnet_plan, second, offset=resnet_plan.tensor(first).offset).verify()


@pytest.mark.parametrize("model", ["resnet20", "mobilenet_v2"])
def test_fp16_weight_copies_mirror_the_parameter_region_element_for_element(model):
    """One cast kernel sweeps params -> weights16, so every fp16 copy sits at half its master's offset."""
    bp = getattr(zoo, model)()
    hw = 32 if model == "resnet20" else 64
    plan = Compiler(ArchPlan.from_blueprint(bp, fuse=True, amp=True)).compile({"train": (2, hw, hw, 3)})
    params_start, params_bytes = plan.memory.regions["params"]
    w16_start, w16_bytes = plan.memory.regions["weights16"]
    grads_start = plan.memory.regions["grads"][0]
    trainable = [p for p in plan.params if p.region == "params"]
    # after the mirror: the stem's copy padded to the input's padded channels (``ParamSpec.half_padded``)
    padded = [plan.tensor(p.half_padded) for p in trainable if p.half_padded >= 0]
    assert trainable and len(padded) == 1 and w16_bytes == params_bytes // 2 + -(-padded[0].nbytes // 256) * 256
    assert padded[0].offset == w16_start + params_bytes // 2
    assert sorted([p.half for p in trainable] + [padded[0].id]) == [t.id for t in plan.tensors
                                                                    if t.region == "weights16"]
    for spec in trainable:
        master, copy, grad = (plan.tensor(tid) for tid in (spec.tensor, spec.half, spec.grad))
        assert copy.offset - w16_start == (master.offset - params_start) // 2, spec.name
        assert copy.offset % 256 == 0 and master.offset % 256 == 0
        assert grad.offset - grads_start == master.offset - params_start, spec.name
