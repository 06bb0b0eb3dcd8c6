"""What the plan counts against published numbers: trainable parameters and parameter names
against torchvision's `state_dict`, forward MACs per sample at 224x224 against the published
GMACs, and the memory plan against its own lower bound."""
from __future__ import annotations

import pytest

import planner.memory
from blueprint import zoo
from planner import ArchPlan
from planner.compiler import Compiler
from planner.memory_alloc import assign_offsets_by, live_lower_bound

# torchvision's trainable parameter counts (vgg16_bn without its 13 conv biases, 4,224 values:
# the zoo's convolutions have none, a BN follows each)
TRAINABLE = {
    "resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032, "resnet101": 44_549_160,
    "resnet152": 60_192_808, "mobilenet_v2": 3_504_872, "vgg16_bn": 138_365_992 - 4_224,
    "mobilenet_v3_large": 5_483_032, "mobilenet_v3_small": 2_542_856, "efficientnet_b0": 5_288_548,
}
# forward multiply-accumulates per 224x224 sample (torchvision's GFLOPS column, which counts MACs)
MACS = {"resnet18": 1.81e9, "resnet50": 4.09e9, "mobilenet_v2": 0.30e9, "vgg16_bn": 15.47e9,
        "mobilenet_v3_large": 0.217e9, "mobilenet_v3_small": 0.057e9, "efficientnet_b0": 0.386e9}
# len(torchvision_model.state_dict()); vgg16_bn less its 13 conv biases
STATE_DICT_KEYS = {"resnet18": 122, "resnet50": 320, "mobilenet_v2": 314, "vgg16_bn": 97 - 13,
                   "mobilenet_v3_large": 312, "efficientnet_b0": 360}
KNOWN_KEYS = {
    "resnet18": ["conv1.weight", "bn1.running_mean", "bn1.num_batches_tracked", "layer1.0.conv1.weight",
                 "layer1.0.bn2.running_var", "layer2.0.downsample.0.weight", "layer2.0.downsample.1.bias",
                 "layer4.1.bn2.weight", "fc.weight", "fc.bias"],
    "resnet50": ["conv1.weight", "layer1.0.conv3.weight", "layer1.0.bn3.running_mean", "layer1.0.downsample.0.weight",
                 "layer2.0.downsample.0.weight", "layer3.5.bn2.running_var", "layer4.2.conv3.weight", "fc.bias"],
    "mobilenet_v2": ["features.0.0.weight", "features.0.1.running_var", "features.1.conv.0.0.weight",
                     "features.1.conv.1.weight", "features.1.conv.2.bias", "features.2.conv.0.0.weight",
                     "features.2.conv.1.0.weight", "features.2.conv.2.weight", "features.2.conv.3.running_mean",
                     "features.17.conv.3.num_batches_tracked", "features.18.0.weight", "features.18.1.bias",
                     "classifier.1.weight", "classifier.1.bias"],
    "vgg16_bn": ["features.0.weight", "features.1.running_mean", "features.3.weight", "features.40.weight",
                 "features.41.num_batches_tracked", "classifier.0.weight", "classifier.3.bias",
                 "classifier.6.weight", "classifier.6.bias"],
    "mobilenet_v3_large": ["features.1.block.0.0.weight", "features.2.block.0.0.weight", "features.4.block.2.fc1.weight",
                           "features.4.block.2.fc1.bias", "features.4.block.3.0.weight", "classifier.3.weight"],
    "efficientnet_b0": ["features.1.0.block.1.fc2.weight", "features.2.0.block.0.0.weight",
                        "features.7.0.block.3.1.running_mean", "classifier.1.bias"],
}
NOT_KEYS = {"vgg16_bn": ["features.0.bias", "features.2.weight", "classifier.2.weight"],
            "resnet18": ["layer1.0.downsample.0.weight", "layer1.0.relu.weight"],
            "mobilenet_v2": ["features.1.conv.3.weight", "classifier.0.weight"]}


def plan_of(name: str, fuse: bool = False, training: bool = False):
    entry = zoo.MODELS[name]
    arch = ArchPlan.from_blueprint(entry.build(), in_channels=entry.input_shape[2], fuse=fuse, amp=fuse)
    variants = {"train": (2, *entry.input_shape)} if training else {"eval": (1, *entry.input_shape)}
    return Compiler(arch).compile(variants, training=training)


@pytest.mark.parametrize("name", TRAINABLE)
def test_trainable_parameters_equal_torchvisions(name):
    assert plan_of(name).params_trainable == TRAINABLE[name]


@pytest.mark.parametrize("name", MACS)
def test_forward_macs_per_sample_are_the_published_ones(name):
    plan = plan_of(name)
    assert sum(plan.macs_per_sample.values()) == pytest.approx(MACS[name], rel=0.01)
    assert all(macs >= 0 for macs in plan.macs_per_sample.values())


def test_macs_do_not_depend_on_the_batch():
    entry = zoo.MODELS["resnet20"]
    arch = ArchPlan.from_blueprint(entry.build())
    small, big = (Compiler(arch).compile({"eval": (n, *entry.input_shape)}, training=False) for n in (1, 16))
    assert small.macs_per_sample == big.macs_per_sample


@pytest.mark.parametrize("name", KNOWN_KEYS)
def test_parameter_names_are_torchvisions_state_dict_keys(name):
    names = [p.name for p in plan_of(name).params]
    assert len(names) == len(set(names)) == STATE_DICT_KEYS[name]
    assert set(KNOWN_KEYS[name]) <= set(names)
    assert not set(NOT_KEYS.get(name, [])) & set(names)


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2", "vgg16_bn", "small_cnn", "resnet20"])
def test_fusing_keeps_every_parameter_name_shape_and_region(name):
    unfused, fused = plan_of(name), plan_of(name, fuse=True)
    assert [(p.name, p.shape, p.region) for p in unfused.params] == [(p.name, p.shape, p.region) for p in fused.params]
    assert sum(fused.macs_per_sample.values()) == sum(unfused.macs_per_sample.values())


# The allocator's placement orders against greedy by size alone (its first order, the only one
# before them): (size alone, as planned) transient arena / lower bound, train plan at batch 2, every
# zoo model unfused and fused AMP. Measured; a row missing here is (1.000, 1.000), arena == bound.
# None is missing since the plans keep no unused im2col workspace (mobilenet_v3_small unfused was
# (1.116, 1.000) before: `planner._memory`'s docstring says why).
PLACEMENT_ORDER_GAINS: dict = {}
ZOO_VARIANTS = [pytest.param(name, fuse, id=f"{name}-{'fused' if fuse else 'unfused'}")
                for name in zoo.MODELS for fuse in (False, True)]


@pytest.mark.parametrize("name, fuse", ZOO_VARIANTS)
def test_transient_memory_is_within_5_percent_of_the_lower_bound(name, fuse):
    train = plan_of(name, fuse=fuse, training=True).memory.graphs["train"]
    assert train.transient_lower_bound_bytes <= train.transient_planned_bytes <= 1.05 * train.transient_lower_bound_bytes
    assert train.transient_planned_bytes < train.transient_no_reuse_bytes


@pytest.mark.parametrize("name, fuse", ZOO_VARIANTS)
def test_transient_ratio_with_greedy_by_size_alone_and_as_planned(name, fuse, monkeypatch):
    def ratio():
        train = plan_of(name, fuse=fuse, training=True).memory.graphs["train"]
        return round(train.transient_planned_bytes / train.transient_lower_bound_bytes, 3)

    planned = ratio()
    def by_size_alone(sizes, first, last, alignment):
        return (*assign_offsets_by("size", sizes, first, last, alignment), live_lower_bound(sizes, first, last, alignment))

    monkeypatch.setattr(planner.memory, "plan_offsets", by_size_alone)
    assert (ratio(), planned) == PLACEMENT_ORDER_GAINS.get((name, fuse), (1.0, 1.0))
