"""The model zoo: every entry builds, round-trips through repr, and has the published structure
(blocks per stage, widths, strides), parameter count and torchvision parameter names."""
import math

import pytest

from blueprint import BlockStyle, BluePrint, Kind, Layer, block, relu, repeat, seq, zoo
from planner import ArchPlan
from planner.compiler import Compiler

DSL_NAMESPACE: dict = {}
exec("from blueprint import *", DSL_NAMESPACE)


def count(layer: Layer, kind: Kind) -> int:
    """Nodes of `kind` in the network as it runs: a node inside `repeat(body, n)` counts n times."""
    repeats: dict[str, int] = {}
    total = 0
    for path, node in layer.walk():
        copies = math.prod(times for prefix, times in repeats.items() if path.startswith(prefix + "."))
        if node.kind is Kind.REPEAT:
            repeats[path] = node.params.times
        total += copies if node.kind is kind else 0
    return total


def unrolled(layer: Layer, kind: Kind) -> list[Layer]:
    """The nodes of `kind` in execution order, repeats unrolled."""
    if layer.kind is kind:
        return [layer]
    times = layer.params.times if layer.kind is Kind.REPEAT else 1
    return [node for _ in range(times) for child in layer.children for node in unrolled(child, kind)]


def stage(bp: BluePrint, name: str) -> Layer:
    matches = [node for _, node in bp.walk() if node.kind is Kind.NAMED and node.params.name == name]
    assert len(matches) == 1, f"{bp.name}: expected one named({name!r}, ...) scope, found {len(matches)}"
    return matches[0].children[0]


def top_level(bp: BluePrint) -> list[str]:
    """The root's children: `named:<name>` for scopes, else the kind."""
    assert bp.root.kind is Kind.SEQ
    return [f"named:{c.params.name}" if c.kind is Kind.NAMED else c.kind.value for c in bp.root.children]


def test_count_expands_repeats_and_agrees_with_unrolling():
    net = seq(relu(), repeat(seq(relu(), repeat(relu(), 3)), 2), repeat(block(8, BlockStyle.RESNET_3_3), 4))
    assert count(net, Kind.RELU) == 1 + 2 * (1 + 3) == len(unrolled(net, Kind.RELU))
    assert count(net, Kind.BLOCK) == 4 == len(unrolled(net, Kind.BLOCK))


# ---- every entry ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", zoo.MODELS)
def test_every_model_builds_and_round_trips_through_repr(name):
    entry = zoo.MODELS[name]
    bp = entry.build()
    assert isinstance(bp, BluePrint) and not bp.empty and bp.name == name
    assert bp == entry.build() and hash(bp) == hash(entry.build())
    again = eval(repr(bp), dict(DSL_NAMESPACE))
    assert again == bp and repr(again) == repr(bp)
    assert len(entry.input_shape) == 3 and all(isinstance(d, int) and d > 0 for d in entry.input_shape)
    assert entry.summary
    assert unrolled(bp.root, Kind.FC)[-1].params.out_features == entry.num_classes


@pytest.mark.parametrize("name", [n for n in zoo.MODELS if n != "mlp"])
def test_num_classes_sets_the_last_fc(name):
    bp = zoo.MODELS[name].build(num_classes=7)
    assert unrolled(bp.root, Kind.FC)[-1].params.out_features == 7


# torchvision's parameter counts; its VGGs have conv biases, ours do not (a BN follows)
VGG11_CONV_BIASES = 64 + 128 + 256 * 2 + 512 * 4
VGG16_CONV_BIASES = 64 * 2 + 128 * 2 + 256 * 3 + 512 * 6
TORCHVISION_PARAMS = {
    "resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032, "resnet101": 44_549_160,
    "resnet152": 60_192_808, "mobilenet_v2": 3_504_872,
    "mobilenet_v3_large": 5_483_032, "mobilenet_v3_small": 2_542_856, "efficientnet_b0": 5_288_548,
    "vgg11_bn": 132_868_840 - VGG11_CONV_BIASES, "vgg16_bn": 138_365_992 - VGG16_CONV_BIASES,
}
# torchvision state_dict key counts (weights, biases, BN statistics and num_batches_tracked)
TORCHVISION_KEYS = {
    "resnet18": 122, "resnet34": 218, "resnet50": 320, "resnet101": 626, "resnet152": 932, "mobilenet_v2": 314,
    "vgg11_bn": 62 - 8, "vgg16_bn": 97 - 13,
    "mobilenet_v3_large": 312, "mobilenet_v3_small": 244, "efficientnet_b0": 360,
}
TORCHVISION_KEY_SAMPLES = {
    "resnet18": ["conv1.weight", "bn1.num_batches_tracked", "layer2.0.downsample.0.weight",
                 "layer4.1.bn2.running_var", "fc.weight", "fc.bias"],
    "resnet50": ["layer1.0.downsample.1.running_mean", "layer3.5.conv3.weight", "layer4.2.bn3.bias"],
    "mobilenet_v2": ["features.0.0.weight", "features.1.conv.0.0.weight", "features.1.conv.1.weight",
                     "features.2.conv.0.0.weight", "features.2.conv.1.0.weight", "features.2.conv.2.weight",
                     "features.17.conv.3.running_var", "features.18.0.weight", "classifier.1.bias"],
    "vgg16_bn": ["features.0.weight", "features.1.running_mean", "features.41.weight", "classifier.0.weight",
                 "classifier.6.bias"],
    "mobilenet_v3_large": ["features.0.0.weight", "features.1.block.0.0.weight", "features.1.block.1.0.weight",
                           "features.2.block.0.0.weight", "features.4.block.2.fc1.weight", "features.4.block.2.fc2.bias",
                           "features.4.block.3.1.running_var", "features.16.0.weight", "classifier.0.weight",
                           "classifier.3.bias"],
    "mobilenet_v3_small": ["features.1.block.1.fc1.weight", "features.1.block.2.0.weight", "features.12.1.bias",
                           "classifier.3.weight"],
    "efficientnet_b0": ["features.0.0.weight", "features.1.0.block.0.0.weight", "features.1.0.block.1.fc1.bias",
                        "features.2.1.block.2.fc2.weight", "features.6.3.block.3.1.num_batches_tracked",
                        "features.8.0.weight", "classifier.1.weight"],
}


def cifar_resnet_params(n: int, num_classes: int = 10) -> int:
    """He et al.'s CIFAR ResNet with 1x1 projection shortcuts where the shape changes."""
    def conv_bn(cin, cout, k):
        return k * k * cin * cout + 2 * cout
    total = conv_bn(3, 16, 3)
    cin = 16
    for width in (16, 32, 64):
        for index in range(n):
            total += conv_bn(cin, width, 3) + conv_bn(width, width, 3)
            total += conv_bn(cin, width, 1) if cin != width else 0
            cin = width
    return total + 64 * num_classes + num_classes


EXPECTED_PARAMS = {
    **TORCHVISION_PARAMS,
    "resnet20": cifar_resnet_params(3), "resnet32": cifar_resnet_params(5),
    "resnet56": cifar_resnet_params(9), "resnet110": cifar_resnet_params(18),
    "mlp": 784 * 1024 + 1024 + 1024 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10,
    "small_cnn": (9 * 1 * 32 + 2 * 32) + (9 * 32 * 64 + 2 * 64) + (9 * 64 * 64 + 2 * 64) + 64 * 10 + 10,
}


def test_the_parameter_table_covers_the_zoo():
    assert set(EXPECTED_PARAMS) == set(zoo.MODELS)


@pytest.mark.parametrize("name", zoo.MODELS)
def test_parameter_count_matches_the_reference(name):
    entry = zoo.MODELS[name]
    h, w, c = entry.input_shape
    plan = Compiler(ArchPlan.from_blueprint(entry.build(), in_channels=c)).compile(
        variants={"eval": (1, h, w, c)}, training=False)
    assert plan.params_trainable == EXPECTED_PARAMS[name]
    names = [p.name for p in plan.params]
    assert len(set(names)) == len(names)
    if name in TORCHVISION_KEYS:
        assert len(names) == TORCHVISION_KEYS[name]
    assert set(TORCHVISION_KEY_SAMPLES.get(name, [])) <= set(names)


# ---- ResNets ------------------------------------------------------------------------------------
IMAGENET_RESNETS = {
    "resnet18": (False, (2, 2, 2, 2)), "resnet34": (False, (3, 4, 6, 3)), "resnet50": (True, (3, 4, 6, 3)),
    "resnet101": (True, (3, 4, 23, 3)), "resnet152": (True, (3, 8, 36, 3)),
}
CIFAR_RESNETS = {"resnet20": 3, "resnet32": 5, "resnet56": 9, "resnet110": 18}


@pytest.mark.parametrize("name", IMAGENET_RESNETS)
def test_imagenet_resnets_have_torchvisions_stages(name):
    bottleneck, counts = IMAGENET_RESNETS[name]
    bp = zoo.MODELS[name].build()
    assert top_level(bp) == ["named:conv1", "named:bn1", "relu", "maxpool", "named:layer1", "named:layer2",
                             "named:layer3", "named:layer4", "gap", "named:fc"]
    assert repr(stage(bp, "conv1")) == "conv(64, 7, 2, 3)" and repr(stage(bp, "bn1")) == "bn()"
    assert repr(bp.root.children[3]) == "maxpool(3, 2, 1)" and repr(stage(bp, "fc")) == "fc(1000)"
    assert count(bp.root, Kind.BLOCK) == sum(counts)
    for index, (width, blocks) in enumerate(zip((64, 128, 256, 512), counts)):
        layer = stage(bp, f"layer{index + 1}")
        assert count(layer, Kind.BLOCK) == blocks
        params = [b.params for b in unrolled(layer, Kind.BLOCK)]
        assert len(params) == blocks
        assert [p.style.stride for p in params] == [2 if index else 1] + [1] * (blocks - 1)
        assert all(p.style.bottleneck is bottleneck for p in params)
        assert all(p.out_channels == (4 * width if bottleneck else width) for p in params)
        assert all(p.mid_channels == (width if bottleneck else None) for p in params)


@pytest.mark.parametrize("name", CIFAR_RESNETS)
def test_cifar_resnets_have_three_stages_of_n_blocks(name):
    n = CIFAR_RESNETS[name]
    assert name == f"resnet{6 * n + 2}"
    bp = zoo.MODELS[name].build()
    assert top_level(bp) == ["named:conv1", "named:bn1", "relu", "named:layer1", "named:layer2", "named:layer3",
                             "gap", "named:fc"]
    assert repr(stage(bp, "conv1")) == "conv(16, 3, 1, 1)" and repr(stage(bp, "fc")) == "fc(10)"
    assert count(bp.root, Kind.BLOCK) == 3 * n
    assert count(bp.root, Kind.CONV) == 1  # the block convolutions live inside the block nodes
    for index, width in enumerate((16, 32, 64)):
        layer = stage(bp, f"layer{index + 1}")
        params = [b.params for b in unrolled(layer, Kind.BLOCK)]
        assert count(layer, Kind.BLOCK) == len(params) == n
        assert [p.style for p in params] == ([BlockStyle.RESNET_3_3_DS if index else BlockStyle.RESNET_3_3]
                                             + [BlockStyle.RESNET_3_3] * (n - 1))
        assert all(p.out_channels == width and p.mid_channels is None for p in params)


# ---- MobileNetV2 --------------------------------------------------------------------------------
# torchvision's inverted_residual_setting: expand ratio t, channels c, repeats n, first stride s
TORCHVISION_MOBILENET_V2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                            (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def test_mobilenet_v2_follows_torchvisions_table():
    bp = zoo.mobilenet_v2()
    assert top_level(bp) == ["named:features", "gap", "named:classifier"]
    expected = [(t, c, s if i == 0 else 1, 3) for t, c, n, s in TORCHVISION_MOBILENET_V2 for i in range(n)]
    features = stage(bp, "features")
    blocks = [(p.expand_ratio, p.out_channels, p.stride, p.kernel) for p in
              (b.params for b in unrolled(features, Kind.MBCONV))]
    assert blocks == expected and len(blocks) == 17 == count(bp.root, Kind.MBCONV)
    assert repr(features.children[0]) == "seq(conv(32, 3, 2, 1), bn(), relu6())"
    assert repr(features.children[-1]) == "seq(conv(1280, 1, 1, 0), bn(), relu6())"
    assert repr(stage(bp, "classifier")) == "seq(dropout(0.2), fc(1000))"


# ---- MobileNetV3 and EfficientNet-B0 ------------------------------------------------------------
# torchvision's tables: (input, kernel, expanded, out, SE, activation "RE"/"HS", stride), width 1.0
TORCHVISION_MOBILENET_V3 = {
    "mobilenet_v3_large": [(16, 3, 16, 16, False, "RE", 1), (16, 3, 64, 24, False, "RE", 2),
                           (24, 3, 72, 24, False, "RE", 1), (24, 5, 72, 40, True, "RE", 2),
                           (40, 5, 120, 40, True, "RE", 1), (40, 5, 120, 40, True, "RE", 1),
                           (40, 3, 240, 80, False, "HS", 2), (80, 3, 200, 80, False, "HS", 1),
                           (80, 3, 184, 80, False, "HS", 1), (80, 3, 184, 80, False, "HS", 1),
                           (80, 3, 480, 112, True, "HS", 1), (112, 3, 672, 112, True, "HS", 1),
                           (112, 5, 672, 160, True, "HS", 2), (160, 5, 960, 160, True, "HS", 1),
                           (160, 5, 960, 160, True, "HS", 1)],
    "mobilenet_v3_small": [(16, 3, 16, 16, True, "RE", 2), (16, 3, 72, 24, False, "RE", 2),
                           (24, 3, 88, 24, False, "RE", 1), (24, 5, 96, 40, True, "HS", 2),
                           (40, 5, 240, 40, True, "HS", 1), (40, 5, 240, 40, True, "HS", 1),
                           (40, 5, 120, 48, True, "HS", 1), (48, 5, 144, 48, True, "HS", 1),
                           (48, 5, 288, 96, True, "HS", 2), (96, 5, 576, 96, True, "HS", 1),
                           (96, 5, 576, 96, True, "HS", 1)],
}


@pytest.mark.parametrize("name", TORCHVISION_MOBILENET_V3)
def test_mobilenet_v3_follows_torchvisions_table(name):
    bp = zoo.MODELS[name].build()
    assert top_level(bp) == ["named:features", "gap", "named:classifier"]
    features = stage(bp, "features")
    blocks = [b.params for b in unrolled(features, Kind.MBCONV)]
    # torchvision's _make_divisible(expanded // 4, 8), worked out by hand
    squeeze = {16: 8, 72: 24, 96: 24, 120: 32, 144: 40, 240: 64, 288: 72, 480: 120, 576: 144, 672: 168, 960: 240}
    assert [(p.kernel, p.expanded_channels, p.out_channels, p.se is not None,
             {"relu": "RE", "hardswish": "HS"}[p.act], p.stride) for p in blocks] == \
        [row[1:] for row in TORCHVISION_MOBILENET_V3[name]]
    assert all(p.se.params.squeeze == squeeze[p.expanded_channels] and p.se.params.gate == "hardsigmoid"
               for p in blocks if p.se is not None)
    assert all((p.momentum, p.eps, p.drop_path) == (0.01, 0.001, 0.0) for p in blocks)
    assert repr(features.children[0]) == "seq(conv(16, 3, 2, 1), bn(0.01, 0.001), hardswish())"
    last = 960 if name.endswith("large") else 576
    assert repr(features.children[-1]) == f"seq(conv({last}, 1, 1, 0), bn(0.01, 0.001), hardswish())"
    hidden = 1280 if name.endswith("large") else 1024
    assert repr(stage(bp, "classifier")) == f"seq(fc({hidden}), hardswish(), dropout(0.2), fc(1000))"


def test_efficientnet_b0_follows_torchvisions_table_and_stochastic_depth_rule():
    bp = zoo.efficientnet_b0()
    features = stage(bp, "features")
    blocks = [b.params for b in unrolled(features, Kind.MBCONV)]
    table = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
             (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]
    expected = [(t, k, s if i == 0 else 1, c, max(1, (cin if i == 0 else c) // 4))
                for t, k, s, cin, c, n in table for i in range(n)]
    assert [(p.expand_ratio, p.kernel, p.stride, p.out_channels, p.se.params.squeeze) for p in blocks] == expected
    assert [p.drop_path for p in blocks] == [0.2 * i / 16 for i in range(16)]   # torchvision's sd_prob
    assert all(p.act == "silu" and p.se.params.gate == "sigmoid" and p.se.params.act == "silu" for p in blocks)
    assert [len(c.children) for c in features.children[1:-1]] == [n for *_, n in table]
    assert repr(stage(bp, "classifier")) == "seq(dropout(0.2), fc(1000))"
    assert repr(features.children[-1]) == "seq(conv(1280, 1, 1, 0), bn(), silu())"
    off = stage(zoo.efficientnet_b0(10, 0.0, 0.0), "features")
    assert all(b.params.drop_path == 0.0 for b in unrolled(off, Kind.MBCONV))


# ---- VGG ----------------------------------------------------------------------------------------
TORCHVISION_VGG = {  # torchvision cfgs "A" and "D"
    "vgg11_bn": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16_bn": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}


@pytest.mark.parametrize("name, convs", [("vgg11_bn", 8), ("vgg16_bn", 13)])
def test_vgg_has_its_convolutions_and_five_max_pools(name, convs):
    bp = zoo.MODELS[name].build()
    assert top_level(bp) == ["named:features", "flatten", "named:classifier"]
    features = stage(bp, "features")
    assert count(features, Kind.CONV) == convs == count(features, Kind.BN) == count(features, Kind.RELU)
    assert count(features, Kind.MAXPOOL) == 5
    assert all(repr(p) == "maxpool(2, 2, 0)" for p in unrolled(features, Kind.MAXPOOL))
    layout = [repr(c) for c in features.children]
    expected = []
    for item in TORCHVISION_VGG[name]:
        expected += ["maxpool(2, 2, 0)"] if item == "M" else [f"conv({item}, 3, 1, 1)", "bn()", "relu()"]
    assert layout == expected
    assert repr(stage(bp, "classifier")) == ("seq(fc(4096), relu(), dropout(0.5), fc(4096), relu(), dropout(0.5), "
                                             "fc(1000))")


# ---- the small ones -----------------------------------------------------------------------------
def test_mlp_and_small_cnn():
    assert repr(zoo.mlp().root) == "seq(fc(1024), relu(), fc(512), relu(), fc(256), relu(), fc(10))"
    assert repr(zoo.mlp([784, 10]).root) == "seq(fc(10))"
    with pytest.raises(ValueError, match="at least two positive ints"):
        zoo.mlp([784])
    with pytest.raises(ValueError, match="at least two positive ints"):
        zoo.mlp([784, 0, 10])
    assert repr(zoo.small_cnn().root) == ("seq(cbr(32, 3, 1, 1), cbrp(64, 3, 1, 1, 2, 2, 0), cbr(64, 3, 1, 1), "
                                          "gap(), fc(10))")
