"""Standard networks built from the factories only.

Parameter names follow torchvision's `state_dict` keys (through `named(...)` scopes), so
torchvision weights load directly; README's "Parameter names" states the scheme, and
`planner/_expand.py` applies it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from blueprint._factories import (
    block, bn, cbr, cbrp, conv, dropout, fc, flatten, gap, hardswish, maxpool, mbconv, named, relu, relu6, repeat,
    se, seq, silu,
)
from blueprint._layer import BlockStyle, BluePrint, Layer

_dropout = dropout   # the MobileNetV3 / EfficientNet builders take a `dropout` argument, as torchvision's


def _stage(name: str, first: Layer, rest: Layer, count: int) -> Layer:
    body = seq(first, repeat(rest, count - 1)) if count > 1 else seq(first)
    return named(name, body)


def _resnet_imagenet(bottleneck: bool, counts: tuple[int, int, int, int], num_classes: int, name: str) -> BluePrint:
    stages = []
    for index, (width, count) in enumerate(zip((64, 128, 256, 512), counts)):
        if bottleneck:
            style, plain = (BlockStyle.RESNET_1_3_1_DS if index else BlockStyle.RESNET_1_3_1), BlockStyle.RESNET_1_3_1
            first, rest = block(width, 4 * width, style), block(width, 4 * width, plain)
        else:
            style, plain = (BlockStyle.RESNET_3_3_DS if index else BlockStyle.RESNET_3_3), BlockStyle.RESNET_3_3
            first, rest = block(width, style), block(width, plain)
        stages.append(_stage(f"layer{index + 1}", first, rest, count))
    root = seq(named("conv1", conv(64, 7, 2, 3)), named("bn1", bn()), relu(), maxpool(3, 2, 1),
               *stages, gap(), named("fc", fc(num_classes)))
    return BluePrint(root, name)


def resnet18(num_classes: int = 1000) -> BluePrint:
    """torchvision's ResNet-18 (basic blocks 2-2-2-2), 224x224x3 input."""
    return _resnet_imagenet(False, (2, 2, 2, 2), num_classes, "resnet18")


def resnet34(num_classes: int = 1000) -> BluePrint:
    """torchvision's ResNet-34 (basic blocks 3-4-6-3)."""
    return _resnet_imagenet(False, (3, 4, 6, 3), num_classes, "resnet34")


def resnet50(num_classes: int = 1000) -> BluePrint:
    """torchvision's ResNet-50 v1.5 (bottlenecks 3-4-6-3, stride on the 3x3)."""
    return _resnet_imagenet(True, (3, 4, 6, 3), num_classes, "resnet50")


def resnet101(num_classes: int = 1000) -> BluePrint:
    """torchvision's ResNet-101 (bottlenecks 3-4-23-3)."""
    return _resnet_imagenet(True, (3, 4, 23, 3), num_classes, "resnet101")


def resnet152(num_classes: int = 1000) -> BluePrint:
    """torchvision's ResNet-152 (bottlenecks 3-8-36-3)."""
    return _resnet_imagenet(True, (3, 8, 36, 3), num_classes, "resnet152")


def _resnet_cifar(n: int, num_classes: int, name: str) -> BluePrint:
    stages = []
    for index, width in enumerate((16, 32, 64)):
        style = BlockStyle.RESNET_3_3_DS if index else BlockStyle.RESNET_3_3
        stages.append(_stage(f"layer{index + 1}", block(width, style), block(width, BlockStyle.RESNET_3_3), n))
    root = seq(named("conv1", conv(16, 3, 1, 1)), named("bn1", bn()), relu(), *stages, gap(), named("fc", fc(num_classes)))
    return BluePrint(root, name)


def resnet20(num_classes: int = 10) -> BluePrint:
    """He et al. (2016) CIFAR ResNet-20: 3 stages of 3 basic blocks, widths 16/32/64,
    projection shortcuts where the shape changes; 32x32x3 input."""
    return _resnet_cifar(3, num_classes, "resnet20")


def resnet32(num_classes: int = 10) -> BluePrint:
    """He et al. CIFAR ResNet-32 (5 blocks per stage)."""
    return _resnet_cifar(5, num_classes, "resnet32")


def resnet56(num_classes: int = 10) -> BluePrint:
    """He et al. CIFAR ResNet-56 (9 blocks per stage)."""
    return _resnet_cifar(9, num_classes, "resnet56")


def resnet110(num_classes: int = 10) -> BluePrint:
    """He et al. CIFAR ResNet-110 (18 blocks per stage)."""
    return _resnet_cifar(18, num_classes, "resnet110")


_VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def _vgg_bn(config: tuple, num_classes: int, name: str) -> BluePrint:
    features = []
    for item in config:
        features += [maxpool(2, 2)] if item == "M" else [conv(item, 3, 1, 1), bn(), relu()]
    classifier = seq(fc(4096), relu(), dropout(0.5), fc(4096), relu(), dropout(0.5), fc(num_classes))
    return BluePrint(seq(named("features", seq(features)), flatten(), named("classifier", classifier)), name)


def vgg11_bn(num_classes: int = 1000) -> BluePrint:
    """torchvision's VGG-11 with BN, convolutions without bias; 224x224x3 input
    (torchvision's adaptive 7x7 average pool is the identity there and is left out)."""
    return _vgg_bn(_VGG11, num_classes, "vgg11_bn")


def vgg16_bn(num_classes: int = 1000) -> BluePrint:
    """torchvision's VGG-16 with BN, convolutions without bias; 224x224x3 input."""
    return _vgg_bn(_VGG16, num_classes, "vgg16_bn")


# (expand ratio t, channels c, repeats n, first stride s), torchvision's table
_MOBILENET_V2_SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def mobilenet_v2(num_classes: int = 1000) -> BluePrint:
    """torchvision's MobileNetV2 (width 1.0): 17 inverted residuals, dropout 0.2 before the
    classifier; 224x224x3 input."""
    features = [seq(conv(32, 3, 2, 1), bn(), relu6())]
    for t, c, n, s in _MOBILENET_V2_SETTING:
        features.append(mbconv(t, c, s))
        if n > 1:
            features.append(repeat(mbconv(t, c, 1), n - 1))
    features.append(seq(conv(1280, 1, 1, 0), bn(), relu6()))
    root = seq(named("features", seq(features)), gap(), named("classifier", seq(dropout(0.2), fc(num_classes))))
    return BluePrint(root, "mobilenet_v2")


def _make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's `_make_divisible`: the nearest multiple of `divisor`, never below 90% of `value`."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


# MobileNetV3 (input, kernel, expanded, out, SE, activation, stride), torchvision's tables (width 1.0)
_MOBILENET_V3_LARGE = (
    (16, 3, 16, 16, False, "relu", 1), (16, 3, 64, 24, False, "relu", 2), (24, 3, 72, 24, False, "relu", 1),
    (24, 5, 72, 40, True, "relu", 2), (40, 5, 120, 40, True, "relu", 1), (40, 5, 120, 40, True, "relu", 1),
    (40, 3, 240, 80, False, "hardswish", 2), (80, 3, 200, 80, False, "hardswish", 1),
    (80, 3, 184, 80, False, "hardswish", 1), (80, 3, 184, 80, False, "hardswish", 1),
    (80, 3, 480, 112, True, "hardswish", 1), (112, 3, 672, 112, True, "hardswish", 1),
    (112, 5, 672, 160, True, "hardswish", 2), (160, 5, 960, 160, True, "hardswish", 1),
    (160, 5, 960, 160, True, "hardswish", 1),
)
_MOBILENET_V3_SMALL = (
    (16, 3, 16, 16, True, "relu", 2), (16, 3, 72, 24, False, "relu", 2), (24, 3, 88, 24, False, "relu", 1),
    (24, 5, 96, 40, True, "hardswish", 2), (40, 5, 240, 40, True, "hardswish", 1),
    (40, 5, 240, 40, True, "hardswish", 1), (40, 5, 120, 48, True, "hardswish", 1),
    (48, 5, 144, 48, True, "hardswish", 1), (48, 5, 288, 96, True, "hardswish", 2),
    (96, 5, 576, 96, True, "hardswish", 1), (96, 5, 576, 96, True, "hardswish", 1),
)
_MOBILENET_V3_BN = (0.01, 0.001)   # torchvision's norm_layer for MobileNetV3: momentum 0.01, eps 0.001


def _mobilenet_v3(setting, last_channel: int, num_classes: int, dropout_p: float, name: str) -> BluePrint:
    features = [seq(conv(setting[0][0], 3, 2, 1), bn(*_MOBILENET_V3_BN), hardswish())]
    for in_ch, k, expanded, out, use_se, act, stride in setting:
        gate = se(_make_divisible(expanded // 4), "hardsigmoid") if use_se else None
        features.append(mbconv(1, out, stride, k, act, gate, 0.0, expanded, *_MOBILENET_V3_BN))
    last_in = setting[-1][3]
    features.append(seq(conv(6 * last_in, 1, 1, 0), bn(*_MOBILENET_V3_BN), hardswish()))
    classifier = seq(fc(last_channel), hardswish(), _dropout(dropout_p), fc(num_classes))
    return BluePrint(seq(named("features", seq(features)), gap(), named("classifier", classifier)), name)


def mobilenet_v3_large(num_classes: int = 1000, dropout: float = 0.2) -> BluePrint:
    """torchvision's MobileNetV3-Large (width 1.0): 15 inverted residuals with hardswish / ReLU,
    squeeze-excitation with a hardsigmoid gate, BN momentum 0.01 and eps 0.001, `dropout` in the
    classifier (torchvision's argument of that name); 224x224x3 input."""
    return _mobilenet_v3(_MOBILENET_V3_LARGE, 1280, num_classes, dropout, "mobilenet_v3_large")


def mobilenet_v3_small(num_classes: int = 1000, dropout: float = 0.2) -> BluePrint:
    """torchvision's MobileNetV3-Small (width 1.0): 11 inverted residuals; 224x224x3 input."""
    return _mobilenet_v3(_MOBILENET_V3_SMALL, 1024, num_classes, dropout, "mobilenet_v3_small")


# EfficientNet-B0 (expand ratio, kernel, first stride, input, out, blocks), torchvision's table
_EFFICIENTNET_B0 = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
                    (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))


def efficientnet_b0(num_classes: int = 1000, dropout: float = 0.2, stochastic_depth_prob: float = 0.2) -> BluePrint:
    """torchvision's EfficientNet-B0: SiLU MBConv blocks with squeeze-excitation (max(1, in // 4)
    channels, sigmoid gate), stochastic depth rising linearly from 0 to `stochastic_depth_prob` over the
    16 blocks (applied where a block has its identity shortcut), `dropout` before the classifier
    (torchvision's arguments of those names); 224x224x3 input."""
    total = sum(row[-1] for row in _EFFICIENTNET_B0)
    features, block_id = [seq(conv(32, 3, 2, 1), bn(), silu())], 0
    for ratio, k, stride, in_ch, out, count in _EFFICIENTNET_B0:
        stage = []
        for index in range(count):
            block_in = in_ch if index == 0 else out
            p = stochastic_depth_prob * block_id / total
            stage.append(mbconv(ratio, out, stride if index == 0 else 1, k, "silu", se(max(1, block_in // 4),
                                "sigmoid", "silu"), p))
            block_id += 1
        features.append(seq(stage))
    features.append(seq(conv(1280, 1, 1, 0), bn(), silu()))
    classifier = seq(_dropout(dropout), fc(num_classes))
    return BluePrint(seq(named("features", seq(features)), gap(), named("classifier", classifier)), "efficientnet_b0")


def mlp(sizes=(784, 1024, 512, 256, 10)) -> BluePrint:
    """A ReLU MLP; `sizes[0]` is the input feature count, the rest are the fc widths.
    Parameter names match `torch.nn.Sequential(Linear, ReLU, ..., Linear)`: `0.weight`, `2.weight`, ...

    >>> mlp([784, 128, 10]).root
    seq(fc(128), relu(), fc(10))
    """
    sizes = list(sizes)
    if len(sizes) < 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in sizes):
        raise ValueError(f"mlp(): sizes must be at least two positive ints (input, ..., classes), got {sizes!r}")
    layers = []
    for width in sizes[1:-1]:
        layers += [fc(width), relu()]
    layers.append(fc(sizes[-1]))
    return BluePrint(seq(layers), "mlp")


def small_cnn(num_classes: int = 10) -> BluePrint:
    """The default demo's network: three CBR layers, one max pool, GAP + FC; made for
    8x8 grey images (the UCI digits) but any size >= 2x2 works."""
    root = seq(cbr(32, 3, 1, 1), cbrp(64, 3, 1, 1, 2, 2, 0), cbr(64, 3, 1, 1), gap(), fc(num_classes))
    return BluePrint(root, "small_cnn")


@dataclass(frozen=True)
class ZooEntry:
    build: Callable[..., BluePrint]
    input_shape: tuple[int, int, int]  # (H, W, C) the model is made for
    num_classes: int
    summary: str


class UnknownModelError(KeyError, ValueError):
    """A zoo name that is not in `MODELS` (a KeyError for mapping code, a ValueError for the CLI)."""

    def __str__(self) -> str:
        return self.args[0]


class _ModelTable(dict):
    def __missing__(self, name):
        raise UnknownModelError(f"unknown zoo model {name!r}; known models: {', '.join(self)}")


MODELS: dict[str, ZooEntry] = _ModelTable({
    "small_cnn": ZooEntry(small_cnn, (8, 8, 1), 10, "3 CBR + max pool + GAP + FC (the default demo, UCI digits)"),
    "mlp": ZooEntry(mlp, (1, 1, 784), 10, "MLP 784-1024-512-256-10"),
    "resnet20": ZooEntry(resnet20, (32, 32, 3), 10, "He et al. CIFAR ResNet-20"),
    "resnet32": ZooEntry(resnet32, (32, 32, 3), 10, "He et al. CIFAR ResNet-32"),
    "resnet56": ZooEntry(resnet56, (32, 32, 3), 10, "He et al. CIFAR ResNet-56"),
    "resnet110": ZooEntry(resnet110, (32, 32, 3), 10, "He et al. CIFAR ResNet-110"),
    "resnet18": ZooEntry(resnet18, (224, 224, 3), 1000, "torchvision ResNet-18"),
    "resnet34": ZooEntry(resnet34, (224, 224, 3), 1000, "torchvision ResNet-34"),
    "resnet50": ZooEntry(resnet50, (224, 224, 3), 1000, "torchvision ResNet-50 (v1.5)"),
    "resnet101": ZooEntry(resnet101, (224, 224, 3), 1000, "torchvision ResNet-101"),
    "resnet152": ZooEntry(resnet152, (224, 224, 3), 1000, "torchvision ResNet-152"),
    "vgg11_bn": ZooEntry(vgg11_bn, (224, 224, 3), 1000, "torchvision VGG-11-BN (conv without bias)"),
    "vgg16_bn": ZooEntry(vgg16_bn, (224, 224, 3), 1000, "torchvision VGG-16-BN (conv without bias)"),
    "mobilenet_v2": ZooEntry(mobilenet_v2, (224, 224, 3), 1000, "torchvision MobileNetV2"),
    "mobilenet_v3_large": ZooEntry(mobilenet_v3_large, (224, 224, 3), 1000, "torchvision MobileNetV3-Large"),
    "mobilenet_v3_small": ZooEntry(mobilenet_v3_small, (224, 224, 3), 1000, "torchvision MobileNetV3-Small"),
    "efficientnet_b0": ZooEntry(efficientnet_b0, (224, 224, 3), 1000, "torchvision EfficientNet-B0"),
})
