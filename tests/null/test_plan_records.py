"""The plan's records link by id and typed fields (planner/plan.py): a parameter carries its gradient,
fp16 copy and optimizer-state tensors; an op's operands are found by (role, position, value), and
each such key names one operand."""
from __future__ import annotations

import pytest

from blueprint import BluePrint, add2, fc, identity, seq, zoo
from planner import NETWORK_INPUT, ArchPlan
from planner.compiler import Compiler
from planner.plan import (
    INPUT_GRADIENTS, Op, Operand, ParamSpec, Region, Role, TensorSpec, new_record, role_named,
)

# (model, fuse and amp, training, optimizer state slots)
PLANS = [
    ("resnet20", False, True, 1),
    ("resnet20", True, True, 2),
    ("mobilenet_v2", True, True, 0),
    ("resnet20", True, False, 0),
    ("small_cnn", False, True, 2),
]


def compile_plan(model, fused, training, slots, batch=2):
    entry = zoo.MODELS[model]
    h, w, c = entry.input_shape
    arch = ArchPlan.from_blueprint(entry.build(), in_channels=c, fuse=fused, amp=fused)
    variants = {"train": (batch, h, w, c), "eval": (1, h, w, c)} if training else {"eval": (1, h, w, c)}
    return Compiler(arch).compile(variants, training=training, optimizer_state_slots=slots)


@pytest.fixture(scope="module", params=PLANS, ids=[f"{m}-{'fused' if f else 'unfused'}-{'train' if t else 'eval'}-{s}"
                                                    for m, f, t, s in PLANS])
def plan(request):
    return compile_plan(*request.param)


def test_parameters_carry_the_ids_of_their_gradient_copy_and_state(plan):
    """Each link points at the tensor the checkpoint names for it, in the region it belongs to."""
    linked = set()
    for p in plan.params:
        trainable = p.region == Region.PARAMS
        expected_grad = trainable and plan.training
        assert (p.grad >= 0) == expected_grad, p.name
        assert (p.half >= 0) == (trainable and plan.arch.amp), p.name
        assert len(p.state) == (plan.optimizer_state_slots if expected_grad else 0), p.name
        links = [(p.grad, Region.GRADS, f"grad.{p.name}"), (p.half, Region.WEIGHTS16, f"fp16.{p.name}")]
        links += [(tid, Region.OPTIM, f"state{slot}.{p.name}") for slot, tid in enumerate(p.state)]
        for tid, region, name in links:
            if tid >= 0:
                t = plan.tensor(tid)
                assert (t.region, t.name, t.shape) == (region, name, p.shape)
                linked.add(tid)
        # the stem's weight (under AMP, the input's one reader): also an fp16 copy with the input's padded channels
        prim = plan.primitives[p.layer]
        stem = plan.arch.amp and p.role == "weight" and prim.kind == "conv" and NETWORK_INPUT in prim.inputs
        assert (p.half_padded >= 0) == stem, p.name
        if stem:
            t = plan.tensor(p.half_padded)
            assert (t.region, t.name, t.shape) == (Region.WEIGHTS16, f"fp16pad.{p.name}",
                                                   p.shape[:3] + (plan.arch.input_channels_padded,))
            linked.add(p.half_padded)
        assert plan.tensor(p.tensor).name == p.name and p.role == p.name.rsplit(".", 1)[-1]
    # every gradient, copy and state tensor belongs to exactly one parameter
    assert linked == {t.id for t in plan.tensors if t.region in (Region.GRADS, Region.WEIGHTS16, Region.OPTIM)}


def test_operand_keys_name_one_operand_each(plan):
    """`op.read(role, position, value)` is unambiguous in every op but the optimizer (which lists all
    parameters under one role and is read whole)."""
    for graph in plan.graphs.values():
        for op in graph.ops:
            if op.kind == "optimizer":
                continue
            for operands in (op.reads, op.writes):
                keys = [(o.role, o.position, o.value) for o in operands]
                assert len(keys) == len(set(keys)), (graph.name, op.index, op.name, keys)


def test_fused_operands_name_their_primitive_and_value(plan):
    """Fused ops: per-primitive operands carry a position of one of the op's primitives; saved,
    recomputed and internal-gradient operands carry the value their tensor holds; input gradients
    the input they belong to. Unfused ops carry neither."""
    positions, start = [], 0
    for layer in plan.arch.layers:
        positions.append(range(start, start + (len(layer.sub) or 1)))
        start += len(layer.sub) or 1
    prefix = {Role.SAVED: "v", Role.RECOMPUTE: "r", Role.GRAD: "g", Role.DX: "d"}
    for graph in plan.graphs.values():
        for op in graph.ops:
            if op.layer < 0:
                continue
            layer = plan.arch.layers[op.layer]
            for o in op.reads + op.writes:
                if not layer.sub:
                    assert (o.position, o.value) == (-1, -1), (op.name, o)
                elif o.value >= 0:
                    assert o.role in prefix and o.position == -1, (op.name, o)
                    name = plan.tensor(o.tensor).name
                    assert name in (f"{graph.name}.{prefix[o.role]}{o.value}", "input"), (op.name, o, name)
                    assert o.role != Role.DX or o.value in layer.inputs
                elif o.role not in (Role.DY,):
                    assert o.position in positions[op.layer], (op.name, o)


def test_input_gradients_say_whether_they_accumulate():
    """z = x + (x + x): the outer add's backward writes x's gradient first; the inner add then adds
    onto it through both roles. Only input gradients carry `accumulate`."""
    root = seq(fc(4), add2(identity(), add2(identity(), identity())), fc(3))
    plan = Compiler(ArchPlan.from_blueprint(BluePrint(root))).compile({"train": (2, 1, 1, 3)})
    outer, inner = [op for op in plan.graphs["train"].ops if op.kind == "add" and op.direction == "backward"]
    assert [(o.role, o.accumulate) for o in outer.writes if o.role in INPUT_GRADIENTS] == [(Role.DA, False),
                                                                                         (Role.DB, False)]
    assert [(o.role, o.accumulate) for o in inner.writes if o.role in INPUT_GRADIENTS] == [(Role.DA, True),
                                                                                         (Role.DB, True)]
    assert not any(o.accumulate for op in plan.graphs["train"].ops for o in op.writes if o.role not in INPUT_GRADIENTS)


def test_lookups_match_every_field():
    op = Op(0, "cbr", "backward", 0, "block", reads=(Operand(Role.WEIGHT, 10, 3), Operand(Role.SAVED, 11, -1, 7),
                                                      Operand(Role.WEIGHT, 12)),
            writes=(Operand(Role.DX, 13, -1, 7, True),))
    assert op.read(Role.WEIGHT, 3) == 10 and op.read(Role.WEIGHT) == 12 and op.read(Role.WEIGHT, 4) is None
    assert op.read(Role.SAVED, value=7) == 11 and op.read(Role.SAVED) is None
    assert op.read("weight", 3) == 10           # a Role is its string
    assert op.writing(Role.DX, value=7).accumulate and op.written(Role.DX, value=8) is None
    assert [o.label for o in op.reads + op.writes] == ["3:weight", "saved7", "weight", "dx7"]


def test_an_operand_name_the_planner_does_not_know_raises():
    assert role_named("running_var", "bn2d parameter") is Role.RUNNING_VAR
    with pytest.raises(ValueError, match=r"conv extra: the registry names an operand 'colbuf' .* add it to Role"):
        role_named("colbuf", "conv extra")


def test_records_built_from_their_fields_equal_the_named_constructor():
    """`new_record` (the compiler's fast path) makes the same record as the class called with every field."""
    fields = {Operand: (Role.DX, 13, -1, 7, True),
              TensorSpec: (4, "train.v3", Region.TRANSIENT, "float32", (2, 3), 24, 256, "train", (("train", (2, 3)),)),
              ParamSpec: ("conv1.weight", 0, (8, 3, 3, 3), Region.PARAMS, "kaiming", 0, "ohwi", (), 27, 72,
                          Role.WEIGHT, 5, -1, (6,), 9),
              Op: (0, "conv", "forward", 0, "conv1", (Operand(Role.X, 1),), (Operand(Role.Y, 2),), (("training", True),))}
    for record, values in fields.items():
        built = new_record(record, values)
        assert type(built) is record and built == record(*values) and built._asdict() == record(*values)._asdict()


def test_every_record_of_a_plan_has_all_its_fields(plan):
    """A record built by `new_record` from a too-short or too-long tuple would still be a tuple of its
    class; each one in a compiled plan must have exactly its class's fields, of the right kinds."""
    for spec in plan.params:
        assert type(spec) is ParamSpec and len(spec) == len(ParamSpec._fields), spec
        assert type(spec.role) is Role and type(spec.region) is Region and isinstance(spec.state, tuple), spec
    for t in plan.tensors:
        assert type(t) is TensorSpec and len(t) == len(TensorSpec._fields), t
        assert type(t.region) is Region and t.offset >= 0, t
    for graph in plan.graphs.values():
        for op in graph.ops:
            assert type(op) is Op and len(op) == len(Op._fields), op
            for o in op.reads + op.writes:
                assert type(o) is Operand and len(o) == len(Operand._fields), (op.name, o)
                assert type(o.role) is Role and type(o.accumulate) is bool, (op.name, o)
                assert isinstance(o.tensor, int) and isinstance(o.position, int) and isinstance(o.value, int)


@pytest.mark.parametrize("batch", [2, 16])
def test_every_unfused_convolution_records_its_cpu_algorithms(batch):
    """Each conv op of every graph carries the ``conv`` attr: the rule applied to its own weight, stride, padding
    and groups, and to the largest variant's image (written out here for resnet20's layers: its 64-channel 8x8
    layers are Winograd's with 16 tiles a sample at batch 16, not at batch 2; the eval graph's batch 1 has the
    train graph's choice), the same in forward and backward; the per-layer summary shows it."""
    from blueprint._summary import cpu_conv_algorithms, format_summary
    from planner.conv_algorithm import ConvAlgorithms, target_vector_registers
    plan = compile_plan("resnet20", False, True, 1, batch)
    wide = target_vector_registers() == 32   # AVX-512: the direct kernels take 64 channels too
    winograd = (("winograd", "direct", "direct") if wide else ("winograd", "winograd", "gemm")) if batch == 16 else \
        (("direct", "direct", "direct") if wide else ("gemm", "gemm", "gemm"))
    weight = {p.layer: p.shape for p in plan.params if p.role is Role.WEIGHT}
    expected = {  # (weight shape, stride) -> algorithms
        ((16, 3, 3, 3), 1): ("direct", "gemm", "direct"),   # the stem: dW blocks across the kernel columns
        ((16, 3, 3, 16), 1): ("direct", "direct", "direct"),
        ((32, 3, 3, 16), 2): ("direct", "direct", "direct"),
        ((32, 3, 3, 32), 1): ("direct", "direct", "direct"),
        ((32, 1, 1, 16), 2): ("direct", "direct", "direct"),
        ((64, 3, 3, 32), 2): ("direct", "direct", "direct") if wide else ("gemm", "direct", "gemm"),
        ((64, 3, 3, 64), 1): winograd,
        ((64, 1, 1, 32), 2): ("direct", "direct", "direct") if wide else ("gemm", "direct", "gemm"),
    }
    seen = 0
    for graph in plan.graphs.values():
        for op in graph.ops:
            if op.kind != "conv":
                assert op.attr("conv") is None
                continue
            layer = plan.arch.layers[op.layer]
            recorded = op.attr("conv")
            assert isinstance(recorded, ConvAlgorithms)
            assert tuple(recorded) == expected[weight[op.layer], layer.param("stride")], op.name
            seen += 1
    assert seen == 21 * 3    # resnet20's 21 convolutions: train forward, backward, eval forward
    table = format_summary(plan, None)
    assert len(cpu_conv_algorithms(plan)) == 21
    assert "layer1.0.conv1" in table and "fwd direct, dx direct, dW direct" in table


@pytest.mark.parametrize("model", ["resnet20", "resnet18", "mobilenet_v2"])
def test_a_convolution_has_an_im2col_workspace_only_where_its_cpu_algorithm_is_gemm(model):
    """An fp32 plan gives a convolution's forward op a ``COL`` workspace when its forward is im2col + GEMM, and its
    backward op one when its weight gradient is, or its input gradient and the input needs one (not the network
    input); an AMP plan (the CUDA path, which reads none) gives none."""
    plan = compile_plan(model, False, True, 1)
    seen = {"f": 0, "b": 0}
    for graph in plan.graphs.values():
        for op in graph.ops:
            if op.kind != "conv":
                continue
            algorithms, x = op.attr("conv"), op.read(Role.X)
            if op.direction == "forward":
                want, phase = algorithms.forward == "gemm", "f"
            else:
                wants_dx = x != plan.io["input"]
                want, phase = algorithms.weight_grad == "gemm" or (wants_dx and algorithms.input_grad == "gemm"), "b"
            assert (op.written(Role.COL) is not None) == want, (op.name, op.direction, algorithms)
            seen[phase] += want
    # resnet18's wide layers are im2col + GEMM's on any target; mobilenet_v2's one 3x3 groups-1 layer, the stem, is
    # direct; resnet20's layers may all be direct (with 32 vector registers): it has none to require
    required = {"resnet18": ("f", "b"), "mobilenet_v2": ("b",), "resnet20": ()}[model]
    assert all(seen[phase] for phase in required), seen
    fused = compile_plan(model, True, True, 1)
    assert not [t.name for t in fused.tensors if ":col_" in t.name]
