"""Squeeze-excitation, drop_path and the extended mbconv in the planner: what they expand to, their
names and PyTorch layouts, which of them the fusion passes merge, and the summary's counts."""
import numpy as np
import pytest

import blueprint
from blueprint import BluePrint, conv, drop_path, gap_fc, mbconv, se, seq, zoo
from planner import ArchPlan
from planner.compiler import Compiler
from planner.init import from_torch_layout, to_torch_layout, torch_shape
from planner.ops import OPS, Prim, ShapeError

SE_KINDS = ["gap", "fc", "relu", "fc", "hardsigmoid", "channel_mul"]


def kinds(bp, **kw):
    return [layer.kind for layer in ArchPlan.from_blueprint(bp, in_channels=3, **kw).layers]


def test_se_expands_to_torchvisions_squeeze_excitation():
    arch = ArchPlan.from_blueprint(BluePrint(seq(conv(16, 3, 1, 1), se(4, "hardsigmoid"), gap_fc(3))))
    layers = arch.layers[1:7]
    assert [l.kind for l in layers] == SE_KINDS
    pool, fc1, act, fc2, gate, scale = layers
    assert (fc1.param("out_features"), fc2.param("out_features")) == (4, 16)
    assert fc1.param("bias") and fc2.param("bias")
    assert [fc1.prefix, fc2.prefix] == ["1.fc1", "1.fc2"]
    assert scale.inputs == (arch.layers[0].output, gate.output), "the se input times the gate"
    assert pool.inputs == (arch.layers[0].output,)


@pytest.mark.parametrize("squeeze, channels, expected", [(0.25, 16, 4), (0.25, 6, 1), (1.0, 6, 6), (5, 16, 5)])
def test_se_squeeze_is_a_count_or_a_fraction_of_its_input(squeeze, channels, expected):
    arch = ArchPlan.from_blueprint(BluePrint(seq(conv(channels, 1), se(squeeze), gap_fc(2))))
    assert next(l for l in arch.layers if l.kind == "fc").param("out_features") == expected


def test_se_projections_are_1x1_convolutions_in_pytorch_layout():
    bp = BluePrint(seq(conv(8, 3, 1, 1), se(2, "sigmoid", "silu"), gap_fc(3)))
    plan = Compiler(ArchPlan.from_blueprint(bp)).compile({"eval": (2, 5, 5, 3)}, training=False)
    spec = {p.name: p for p in plan.params}
    assert spec["1.fc1.weight"].shape == (2, 8) and torch_shape(spec["1.fc1.weight"]) == (2, 8, 1, 1)
    assert torch_shape(spec["1.fc2.weight"]) == (8, 2, 1, 1) and torch_shape(spec["1.fc2.bias"]) == (8,)
    assert torch_shape(spec["2.weight"]) == (3, 8), "a plain fc keeps its (out, in) layout"
    value = np.arange(16, dtype=np.float32).reshape(2, 8)
    torch_value = to_torch_layout(spec["1.fc1.weight"], value)
    assert torch_value.shape == (2, 8, 1, 1) and np.array_equal(torch_value[:, :, 0, 0], value)
    assert np.array_equal(from_torch_layout(spec["1.fc1.weight"], torch_value), value)


def test_drop_path_leaves_are_primitives_and_mbconv_draws_only_where_it_does_something():
    assert "drop_path" in kinds(BluePrint(seq(conv(8, 1), drop_path(0.1), gap_fc(2))))
    # a leaf is the op table's generic shape-preserving rule, p = 0 included (its kernels keep every sample)
    assert "drop_path" in kinds(BluePrint(seq(conv(8, 1), drop_path(0.0), gap_fc(2))))
    no_draw = kinds(BluePrint(seq(conv(8, 1), mbconv(2, 8, 1, 3, "silu", None, 0.0), gap_fc(2))))
    assert "drop_path" not in no_draw and "add" in no_draw, no_draw   # mbconv: StochasticDepth(0) draws nothing
    residual = kinds(BluePrint(seq(conv(8, 1), mbconv(2, 8, 1, 3, "silu", None, 0.2), gap_fc(2))))
    assert residual.index("drop_path") == residual.index("add") - 1, "on the residual branch, before the add"
    assert "drop_path" not in kinds(BluePrint(seq(conv(8, 1), mbconv(2, 16, 1, 3, "silu", None, 0.2), gap_fc(2))))


def test_fusion_keeps_se_and_non_relu6_blocks_as_primitives():
    bp = BluePrint(seq(conv(8, 3, 1, 1), mbconv(2, 8, 1),                              # MobileNetV2 form: fuses
                       mbconv(2, 8, 1, 3, "hardswish", se(8, "hardsigmoid"), 0.1),     # no fused kind for it
                       mbconv(1, 16, 1, 5, "relu6", None, 0.2),                        # drop_path: no fused kind
                       gap_fc(4)))
    fused = kinds(bp, fuse=True, amp=True)
    assert fused.count("inv_residual") == 1 and fused.count("gap_fc") == 1
    assert fused.count("gap") == 1 and fused.count("fc") == 2, "the se's pool and projection stay separate"
    for kind in ("channel_mul", "hardsigmoid", "hardswish", "drop_path", "relu6"):
        assert kind in fused
    unfused = kinds(bp)
    assert "inv_residual" not in unfused and unfused.count("gap") == 2


def test_mbconv_v3_names_follow_torchvisions_block_layout():
    bp = BluePrint(seq(conv(16, 3, 1, 1), mbconv(1, 24, 2, 3, "relu", se(8, "hardsigmoid"), 0.0, 64),
                       mbconv(1, 24, 1, 3, "hardswish", None, 0.0, 24), gap_fc(2)))
    plan = Compiler(ArchPlan.from_blueprint(bp)).compile({"eval": (1, 8, 8, 3)}, training=False)
    names = {p.name for p in plan.params}
    assert {"1.block.0.0.weight", "1.block.0.1.running_var", "1.block.1.0.weight", "1.block.2.fc1.weight",
            "1.block.3.0.weight", "1.block.3.1.bias", "2.block.0.0.weight", "2.block.1.0.weight"} <= names
    assert not any(n.startswith("2.block.2") for n in names), "no expand stage, no se: two stages"


def test_channel_mul_refuses_a_scale_of_the_wrong_shape():
    arch = ArchPlan.from_blueprint(BluePrint(seq(conv(4, 1), se(2), gap_fc(2))))
    layer = next(l for l in arch.layers if l.kind == "channel_mul")
    with pytest.raises(ShapeError, match=r"expected a scale of shape \(2, 4\) for the input \(2, 3, 3, 4\), got \(2, 5\)"):
        OPS[Prim.CHANNEL_MUL].shape(layer, [(2, 3, 3, 4), (2, 5)])


@pytest.mark.parametrize("name, trainable", [("mobilenet_v3_large", "5,483,032"), ("mobilenet_v3_small", "2,542,856"),
                                             ("efficientnet_b0", "5,288,548")])
def test_summary_counts_the_new_models_as_torchvision_does(name, trainable):
    text = blueprint.summary(zoo.MODELS[name].build(), (64, 64, 3), depth=1)
    assert f"trainable params:     {trainable}" in text
    assert text.splitlines()[2].startswith("features")
