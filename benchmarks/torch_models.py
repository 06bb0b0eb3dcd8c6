"""Hand-written torch.nn reference models for parity tests and benchmarks.

torchvision is not a dependency, so the models are written out here.  Every model's
`state_dict()` keys (and parameter shapes and counts) equal torchvision's, which are
also the parameter names the blueprint zoo produces; so a blueprint's weights can be
loaded into these modules (or the other way round) by name, after transposing
between NHWC/OIHW layouts as the caller needs.

    resnet(block, layers, num_classes)   torchvision ResNet (v1.5: stride on the 3x3)
    resnet18/34/50/101/152               the torchvision configurations
    resnet18_cifar(num_classes)          ResNet-18 as usually trained on CIFAR: 3x3/1 stem, no maxpool
    cifar_resnet(n, num_classes)         He et al. (2016) CIFAR ResNet-(6n+2), projection shortcuts
    resnet20/32/56                       n = 3 / 5 / 9
    mobilenet_v2(num_classes, dropout)   torchvision MobileNetV2 (width 1.0)
    tiny_mobilenet(num_classes)          a small MobileNetV2-style net for parity tests
    mlp(sizes)                           nn.Sequential(Linear, ReLU, ..., Linear)

All convolutions have bias=False.  Default torch init (parity tests overwrite weights).

Run `python benchmarks/torch_models.py` for a self-check of the parameter counts.
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

__all__ = [
    "BasicBlock", "Bottleneck", "ResNet", "resnet", "resnet18", "resnet34", "resnet50",
    "resnet101", "resnet152", "resnet18_cifar", "CifarResNet", "cifar_resnet", "resnet20", "resnet32", "resnet56",
    "InvertedResidual", "MobileNetV2", "mobilenet_v2", "tiny_mobilenet", "mlp", "count_params",
]


def conv3x3(cin: int, cout: int, stride: int = 1, groups: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False)


def conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride, 0, bias=False)


def count_params(model: nn.Module, trainable_only: bool = True) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# --------------------------------------------------------------------------- ResNet

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv3x3(cin, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (ResNet v1.5: the stride sits on the 3x3 conv2)."""
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = conv1x1(cin, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


_BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


class ResNet(nn.Module):
    """torchvision.models.ResNet (no zero-init-residual, groups=1, width 64)."""

    def __init__(self, block: type, layers, num_classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], 2)
        self.layer3 = self._make_layer(block, 256, layers[2], 2)
        self.layer4 = self._make_layer(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        mods = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        mods += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*mods)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet(block: str = "basic", layers=(3, 4, 6, 3), num_classes: int = 1000) -> ResNet:
    if block not in _BLOCKS:
        raise ValueError(f"resnet(block): expected 'basic' or 'bottleneck', got {block!r}")
    return ResNet(_BLOCKS[block], tuple(layers), num_classes)


def resnet18(num_classes: int = 1000) -> ResNet:
    return resnet("basic", (2, 2, 2, 2), num_classes)


def resnet18_cifar(num_classes: int = 10) -> ResNet:
    """ResNet-18 for 32x32 inputs as it is usually trained on CIFAR (e.g. kuangliu/pytorch-cifar):
    torchvision's ResNet-18 with a 3x3 stride-1 stem convolution and no maxpool, so the four
    stages run at 32, 16, 8 and 4 pixels. Same state_dict keys as torchvision's (conv1.weight is
    64x3x3x3); 11,173,962 parameters with 10 classes."""
    model = resnet("basic", (2, 2, 2, 2), num_classes)
    model.conv1 = conv3x3(3, 64)
    model.maxpool = nn.Identity()
    return model


def resnet34(num_classes: int = 1000) -> ResNet:
    return resnet("basic", (3, 4, 6, 3), num_classes)


def resnet50(num_classes: int = 1000) -> ResNet:
    return resnet("bottleneck", (3, 4, 6, 3), num_classes)


def resnet101(num_classes: int = 1000) -> ResNet:
    return resnet("bottleneck", (3, 4, 23, 3), num_classes)


def resnet152(num_classes: int = 1000) -> ResNet:
    return resnet("bottleneck", (3, 8, 36, 3), num_classes)


# --------------------------------------------------------------------------- CIFAR ResNet

class CifarResNet(nn.Module):
    """He et al. (2016) CIFAR ResNet-(6n+2): conv3x3(16) + 3 stages of n BasicBlocks
    (widths 16/32/64; stages 2 and 3 start with stride 2 and a 1x1 projection shortcut),
    global average pool, fc.  Keys: conv1.weight, bn1.*, layer1.0.conv1.weight, ...,
    layer2.0.downsample.0.weight, layer2.0.downsample.1.*, fc.weight, fc.bias."""

    def __init__(self, n: int, num_classes: int = 10):
        super().__init__()
        self.inplanes = 16
        self.conv1 = conv3x3(3, 16)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(16, n, 1)
        self.layer2 = self._make_layer(32, n, 2)
        self.layer3 = self._make_layer(64, n, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(64, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes, stride), nn.BatchNorm2d(planes))
        mods = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        mods += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*mods)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def cifar_resnet(n: int, num_classes: int = 10) -> CifarResNet:
    return CifarResNet(n, num_classes)


def resnet20(num_classes: int = 10) -> CifarResNet:
    return CifarResNet(3, num_classes)


def resnet32(num_classes: int = 10) -> CifarResNet:
    return CifarResNet(5, num_classes)


def resnet56(num_classes: int = 10) -> CifarResNet:
    return CifarResNet(9, num_classes)


# --------------------------------------------------------------------------- MobileNetV2

def _conv_bn_relu6(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    """torchvision's Conv2dNormActivation(..., activation_layer=ReLU6): Sequential(conv, bn, relu6)."""
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    """torchvision's MobileNetV2 InvertedResidual.  `.conv` is
    t != 1: [Sequential(1x1 expand, bn, relu6), Sequential(3x3 dw, bn, relu6), 1x1 project, bn]
    t == 1: [Sequential(3x3 dw, bn, relu6), 1x1 project, bn];
    the identity shortcut is used when stride == 1 and cin == cout."""

    def __init__(self, cin: int, cout: int, stride: int, expand_ratio: int):
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"InvertedResidual(stride): expected 1 or 2, got {stride}")
        hidden = int(round(cin * expand_ratio))
        self.stride = stride
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_bn_relu6(cin, hidden, 1))
        layers += [_conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, 1, 0, bias=False),
                   nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.out_channels = cout

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


_MOBILENET_V2_SETTING = [  # t, c, n, s  (torchvision / Sandler et al. table 2)
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
    (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
]


class MobileNetV2(nn.Module):
    """features -> adaptive_avg_pool2d(1) -> flatten -> classifier, as torchvision."""

    def __init__(self, features: nn.Sequential, classifier: nn.Sequential):
        super().__init__()
        self.features = features
        self.classifier = classifier

    def forward(self, x):
        x = self.features(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1)
        return self.classifier(x)


def mobilenet_v2(num_classes: int = 1000, dropout: float = 0.2) -> MobileNetV2:
    """torchvision.models.mobilenet_v2 (width_mult 1.0, round_nearest 8): 3,504,872 params."""
    cin = 32
    feats: list[nn.Module] = [_conv_bn_relu6(3, cin, 3, 2)]
    for t, c, n, s in _MOBILENET_V2_SETTING:
        for i in range(n):
            feats.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
            cin = c
    feats.append(_conv_bn_relu6(cin, 1280, 1))
    classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(1280, num_classes))
    return MobileNetV2(nn.Sequential(*feats), classifier)


def tiny_mobilenet(num_classes: int = 10) -> MobileNetV2:
    """A small MobileNetV2-style net for parity tests (any input size; e.g. 16x16x3).

    features.0  Sequential(conv3x3 s1 3->8, bn, relu6)
    features.1  InvertedResidual(8->8,  t=1, s=1)   identity shortcut
    features.2  InvertedResidual(8->16, t=6, s=2)
    features.3  InvertedResidual(16->16, t=6, s=1)  identity shortcut
    features.4  Sequential(conv1x1 16->32, bn, relu6)
    classifier  Sequential(Dropout(0.0), Linear(32, num_classes))

    It equals the blueprint
        seq(named("features", seq(seq(conv(8, 3, 1, 1), bn(), relu6()),
                                  mbconv(1, 8, 1), mbconv(6, 16, 2), mbconv(6, 16, 1),
                                  seq(conv(32, 1, 1, 0), bn(), relu6()))),
            gap(), named("classifier", seq(dropout(0.0), fc(num_classes))))
    (state_dict keys and shapes match the blueprint's parameter names).
    """
    feats = nn.Sequential(
        _conv_bn_relu6(3, 8, 3, 1),
        InvertedResidual(8, 8, 1, 1),
        InvertedResidual(8, 16, 2, 6),
        InvertedResidual(16, 16, 1, 6),
        _conv_bn_relu6(16, 32, 1),
    )
    classifier = nn.Sequential(nn.Dropout(p=0.0), nn.Linear(32, num_classes))
    return MobileNetV2(feats, classifier)


# --------------------------------------------------------------------------- MLP

def mlp(sizes=(784, 1024, 512, 256, 10)) -> nn.Sequential:
    """nn.Sequential(Linear, ReLU, ..., Linear); keys 0.weight, 0.bias, 2.weight, ..."""
    sizes = list(sizes)
    if len(sizes) < 2:
        raise ValueError(f"mlp(sizes): need at least an input and an output size, got {sizes}")
    mods: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        if i:
            mods.append(nn.ReLU())
        mods.append(nn.Linear(sizes[i], sizes[i + 1]))
    return nn.Sequential(*mods)


# --------------------------------------------------------------------------- self-check

EXPECTED_PARAMS = {  # torchvision's numbers (trainable parameters)
    "resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032,
    "resnet101": 44_549_160, "resnet152": 60_192_808,
    "mobilenet_v2": 3_504_872, "resnet20": 272_474, "resnet18_cifar": 11_173_962,
}


def self_check(verbose: bool = True) -> None:
    makers = {"resnet18": resnet18, "resnet34": resnet34, "resnet50": resnet50, "resnet101": resnet101,
              "resnet152": resnet152, "mobilenet_v2": mobilenet_v2, "resnet20": resnet20,
              "resnet18_cifar": resnet18_cifar}
    for name, make in makers.items():
        got = count_params(make())
        assert got == EXPECTED_PARAMS[name], f"{name}: {got:,} params, expected {EXPECTED_PARAMS[name]:,}"
        if verbose:
            print(f"{name:14s} {got:>12,} params  ok")
    # Forward shapes.
    with torch.no_grad():
        assert resnet20().eval()(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
        assert tiny_mobilenet().eval()(torch.zeros(2, 3, 16, 16)).shape == (2, 10)
        assert resnet18(7).eval()(torch.zeros(1, 3, 64, 64)).shape == (1, 7)
        assert resnet18_cifar().eval()(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
        assert mlp((5, 4, 3))(torch.zeros(2, 5)).shape == (2, 3)
    assert list(mlp((5, 4, 3)).state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    keys = list(resnet20().state_dict())
    assert "layer2.0.downsample.0.weight" in keys and "layer1.0.downsample.0.weight" not in keys
    keys = list(tiny_mobilenet().state_dict())
    assert "features.1.conv.0.0.weight" in keys and "features.2.conv.3.weight" in keys
    assert "classifier.1.weight" in keys
    if verbose:
        print("forward shapes and keys ok")


if __name__ == "__main__":
    self_check()
