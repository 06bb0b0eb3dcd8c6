"""The PyTorch oracle models (tests/support/torch_models.py) have the zoo's state_dict: the same
keys in the same order, each of the shape our plan gives it in PyTorch layout, so parity tests and
benchmarks move weights between the two by name."""

import pytest

pytest.importorskip("torch", reason="PyTorch not installed: the oracle models need it (pip install torch==2.13.0)")
from tests.support import torch_models  # noqa: E402
from tests.support import torchvision_ref  # noqa: E402

from blueprint import zoo  # noqa: E402
from planner import ArchPlan  # noqa: E402
from planner.compiler import Compiler  # noqa: E402
from planner.init import torch_shape  # noqa: E402


CASES = [
    # name, our blueprint, PyTorch model, input (H, W, C), trainable parameters (torchvision's published count)
    ("resnet18", zoo.resnet18, torch_models.resnet18, (32, 32, 3), 11_689_512),
    ("resnet50", zoo.resnet50, torch_models.resnet50, (32, 32, 3), 25_557_032),
    ("mobilenet_v2", zoo.mobilenet_v2, torch_models.mobilenet_v2, (32, 32, 3), 3_504_872),
    ("resnet20", zoo.resnet20, torch_models.resnet20, (32, 32, 3), 272_474),
    ("mlp", lambda: zoo.mlp([48, 32, 10]), lambda: torch_models.mlp([48, 32, 10]), (1, 1, 48),
     48 * 32 + 32 + 32 * 10 + 10),
]


def _our_state_shapes(bp, hwc):
    plan = Compiler(ArchPlan.from_blueprint(bp, in_channels=hwc[2])).compile({"eval": (1, *hwc)}, training=False)
    return {p.name: torch_shape(p) for p in plan.params}, plan.params_trainable


@pytest.mark.parametrize("name, make_bp, make_torch, hwc, count", CASES, ids=[c[0] for c in CASES])
def test_oracle_model_has_the_zoo_state_dict(name, make_bp, make_torch, hwc, count):
    try:
        model = make_torch()
    except ImportError as error:
        pytest.skip(f"torchvision not importable ({error}); pip install torchvision==0.28.0")
    ours, trainable = _our_state_shapes(make_bp(), hwc)
    theirs = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    assert list(theirs) == list(ours)
    assert theirs == ours
    assert torch_models.count_params(model) == trainable == count


def test_oracle_models_are_torchvision_definitions():
    """resnet18 and mobilenet_v2 are torchvision's own classes, not hand-written twins."""
    tv = torchvision_ref.torchvision_or_skip()
    assert type(torch_models.resnet18()) is tv.models.ResNet
    assert type(torch_models.mobilenet_v2()) is tv.models.MobileNetV2
    tiny = torch_models.tiny_mobilenet()
    assert type(tiny.features[1]) is tv.models.mobilenetv2.InvertedResidual
