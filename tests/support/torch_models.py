"""PyTorch models that the tests and benchmarks compare against (the oracle side of parity checks).

Where torchvision defines the network, this is torchvision's own definition, imported through
``torchvision_ref`` (which imports it even where torchvision's C++ operators fail to register);
the few networks torchvision lacks are assembled from torchvision's own blocks. Every model's
``state_dict()`` keys, shapes and counts equal those the blueprint zoo produces, so weights move
between the two by name (after transposing between NHWC and OIHW as the caller needs).

    resnet18/34/50/101/152(num_classes)  torchvision.models.resnet*
    mobilenet_v2(num_classes, dropout)   torchvision.models.mobilenet_v2 (width 1.0)
    resnet18_cifar(num_classes)          torchvision's ResNet-18 with a 3x3/1 stem and no maxpool
    cifar_resnet(n, num_classes)         He et al. (2016) CIFAR ResNet-(6n+2) of torchvision BasicBlocks
    resnet20/32/56                       n = 3 / 5 / 9
    tiny_mobilenet(num_classes)          a small MobileNetV2 of torchvision InvertedResidual blocks
    mlp(sizes)                           nn.Sequential(Linear, ReLU, ..., Linear) (no torchvision needed)

Import it as the tests do, from the repository root: ``from tests.support import torch_models``. Functions that need torchvision raise
ImportError saying why when it cannot be imported. ``python -m tests.support.torch_models`` checks
the parameter counts against torchvision's published ones.
"""
from __future__ import annotations

import torch
from torch import nn

from tests.support import torchvision_ref

__all__ = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet18_cifar", "CifarResNet",
           "cifar_resnet", "resnet20", "resnet32", "resnet56", "mobilenet_v2", "tiny_mobilenet", "mlp",
           "count_params"]


def _tv():
    return torchvision_ref.import_torchvision()


def count_params(model: nn.Module, trainable_only: bool = True) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# --------------------------------------------------------------------------- torchvision's own

def resnet18(num_classes: int = 1000) -> nn.Module:
    return _tv().models.resnet18(num_classes=num_classes)


def resnet34(num_classes: int = 1000) -> nn.Module:
    return _tv().models.resnet34(num_classes=num_classes)


def resnet50(num_classes: int = 1000) -> nn.Module:
    return _tv().models.resnet50(num_classes=num_classes)


def resnet101(num_classes: int = 1000) -> nn.Module:
    return _tv().models.resnet101(num_classes=num_classes)


def resnet152(num_classes: int = 1000) -> nn.Module:
    return _tv().models.resnet152(num_classes=num_classes)


def mobilenet_v2(num_classes: int = 1000, dropout: float = 0.2) -> nn.Module:
    """torchvision.models.mobilenet_v2 (width_mult 1.0, round_nearest 8): 3,504,872 params."""
    return _tv().models.mobilenet_v2(num_classes=num_classes, dropout=dropout)


def resnet18_cifar(num_classes: int = 10) -> nn.Module:
    """ResNet-18 for 32x32 inputs as it is usually trained on CIFAR (e.g. kuangliu/pytorch-cifar):
    torchvision's ResNet-18 with a 3x3 stride-1 stem convolution and no maxpool, so the four
    stages run at 32, 16, 8 and 4 pixels. Same state_dict keys as torchvision's (conv1.weight is
    64x3x3x3); 11,173,962 parameters with 10 classes."""
    model = resnet18(num_classes)
    model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    model.maxpool = nn.Identity()
    return model


# --------------------------------------------------------------------------- CIFAR ResNet

class CifarResNet(nn.Module):
    """He et al. (2016) CIFAR ResNet-(6n+2): conv3x3(16) + 3 stages of n torchvision BasicBlocks
    (widths 16/32/64; stages 2 and 3 start with stride 2 and a 1x1 projection shortcut),
    global average pool, fc.  Keys: conv1.weight, bn1.*, layer1.0.conv1.weight, ...,
    layer2.0.downsample.0.weight, layer2.0.downsample.1.*, fc.weight, fc.bias."""

    def __init__(self, n: int, num_classes: int = 10):
        super().__init__()
        self.inplanes = 16
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(16, n, 1)
        self.layer2 = self._make_layer(32, n, 2)
        self.layer3 = self._make_layer(64, n, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(64, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        basic_block = _tv().models.resnet.BasicBlock
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, 0, bias=False),
                                       nn.BatchNorm2d(planes))
        mods = [basic_block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        mods += [basic_block(planes, planes) for _ in range(1, blocks)]
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


# --------------------------------------------------------------------------- tiny MobileNetV2

def tiny_mobilenet(num_classes: int = 10) -> nn.Module:
    """A small torchvision MobileNetV2 for parity tests (any input size; e.g. 16x16x3):
    torchvision's MobileNetV2 (features -> adaptive average pool -> classifier) with these
    features, made of torchvision's own blocks:

    features.0  Conv2dNormActivation(conv3x3 s1 3->8, bn, relu6)
    features.1  InvertedResidual(8->8,  t=1, s=1)   identity shortcut
    features.2  InvertedResidual(8->16, t=6, s=2)
    features.3  InvertedResidual(16->16, t=6, s=1)  identity shortcut
    features.4  Conv2dNormActivation(conv1x1 16->32, bn, relu6)
    classifier  Sequential(Dropout(0.0), Linear(32, num_classes))

    It equals the blueprint
        seq(named("features", seq(seq(conv(8, 3, 1, 1), bn(), relu6()),
                                  mbconv(1, 8, 1), mbconv(6, 16, 2), mbconv(6, 16, 1),
                                  seq(conv(32, 1, 1, 0), bn(), relu6()))),
            gap(), named("classifier", seq(dropout(0.0), fc(num_classes))))
    (state_dict keys and shapes match the blueprint's parameter names).
    """
    tv = _tv()
    from torchvision.models.mobilenetv2 import InvertedResidual
    from torchvision.ops.misc import Conv2dNormActivation

    model = tv.models.mobilenet_v2(num_classes=num_classes)
    model.features = nn.Sequential(
        Conv2dNormActivation(3, 8, 3, 1, activation_layer=nn.ReLU6),
        InvertedResidual(8, 8, 1, 1),
        InvertedResidual(8, 16, 2, 6),
        InvertedResidual(16, 16, 1, 6),
        Conv2dNormActivation(16, 32, 1, activation_layer=nn.ReLU6),
    )
    model.classifier = nn.Sequential(nn.Dropout(p=0.0), nn.Linear(32, num_classes))
    return model


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

EXPECTED_PARAMS = {  # torchvision's published numbers, and the CIFAR nets' (trainable parameters)
    "resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032,
    "resnet101": 44_549_160, "resnet152": 60_192_808,
    "mobilenet_v2": 3_504_872, "resnet20": 272_474, "resnet18_cifar": 11_173_962,
}


if __name__ == "__main__":
    for name, expected in EXPECTED_PARAMS.items():
        got = count_params(globals()[name]())
        print(f"{name:14s} {got:>12,} params  {'ok' if got == expected else f'EXPECTED {expected:,}'}")
