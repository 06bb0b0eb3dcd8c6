"""blueprint.summary(bp, input_shape, depth): counts against torchvision's, depth collapsing, memory
totals from the compiled plan, and `blueprint plan --depth` printing the same table."""
import re

import pytest

import blueprint
from blueprint import zoo
from blueprint.cli import main
from blueprint._summary import compile_plan, layer_rows, non_trainable_params, summary_rows

# torchvision's parameter counts (sum of p.numel() over model.parameters()) and, for resnet18, its
# buffers: 4,800 BatchNorm channels x (running_mean, running_var) + 20 num_batches_tracked
TORCHVISION = {"resnet18": (11_689_512, 9_620), "resnet50": (25_557_032, None), "mobilenet_v2": (3_504_872, None)}
SMALL_INPUT = (32, 32, 3)


def count(text: str, label: str) -> int:
    return int(re.search(rf"^{label}: +([\d,]+)", text, re.M).group(1).replace(",", ""))


@pytest.mark.parametrize("name", TORCHVISION)
def test_counts_match_torchvision(name):
    text = blueprint.summary(zoo.MODELS[name].build(), SMALL_INPUT, depth=1)
    trainable, buffers = TORCHVISION[name]
    assert count(text, "trainable params") == trainable
    if buffers is not None:
        assert count(text, "non-trainable params") == buffers
    assert count(text, "total params") == count(text, "trainable params") + count(text, "non-trainable params")


@pytest.fixture(scope="module")
def resnet18_plan():
    return compile_plan(zoo.resnet18(), SMALL_INPUT, 2, 2)


def test_depth_collapses_rows_by_name_prefix(resnet18_plan):
    layers = layer_rows(resnet18_plan)
    by_depth = {depth: summary_rows(resnet18_plan, depth) for depth in (1, 2, 3, None)}
    assert len(by_depth[None]) == len(layers) and [r.path for r in by_depth[None]] == [r["name"] for r in layers]
    assert len(by_depth[1]) < len(by_depth[2]) < len(by_depth[3]) <= len(layers)
    assert all("." not in r.path for r in by_depth[1])
    for rows in by_depth.values():    # nothing lost or counted twice at any depth
        assert sum(r.params for r in rows) == resnet18_plan.params_trainable
        assert sum(r.layers for r in rows) == len(layers)
    depth1 = {r.path: r for r in by_depth[1]}
    depth2 = {r.path: r for r in by_depth[2]}
    assert depth1["layer1"].params == depth2["layer1.0"].params + depth2["layer1.1"].params == 147_968
    assert depth1["layer1"].layers == 14 and depth1["layer1"].kind == "group" and depth1["conv1"].kind == "conv"
    assert depth1["layer4"].output_shape == depth2["layer4.1"].output_shape == (2, 1, 1, 512)   # the group's last
    assert depth1["fc"].macs == 2 * 512 * 1000                                                 # for the batch of 2


def test_memory_totals_are_the_plans(resnet18_plan):
    text = blueprint.summary(zoo.resnet18(), (2,) + SMALL_INPUT, depth=2)
    memory = resnet18_plan.memory
    for nbytes in (memory.arena_bytes, memory.saved_for_backward_bytes, memory.transient_planned_bytes,
                   memory.transient_lower_bound_bytes):
        assert f"{nbytes / 2**20:,.2f} MiB" in text
    assert non_trainable_params(resnet18_plan) == 9_620


def test_plan_depth_prints_the_summary_table(capsys):
    assert main(["plan", "resnet18", "--batch", "1", "--input-shape", "32,32,3", "--depth", "1"]) == 0
    out = capsys.readouterr().out
    assert blueprint.summary(zoo.resnet18(), SMALL_INPUT, depth=1) in out
    assert "module (depth 1)" in out and "\nlayer1 " in out and "layer1.0" not in out


@pytest.mark.parametrize("kwargs, message", [
    ({"input_shape": (3, 32, 32, 3, 1)}, r"expected \(H, W, C\) or \(N, H, W, C\)"),
    ({"input_shape": (32, 32, 0)}, r"found \(32, 32, 0\); pass e.g. \(224, 224, 3\)"),
    ({"input_shape": (32, 32, 3), "depth": 0}, r"expected an int >= 1, found 0; pass e.g. depth=2"),
    ({"input_shape": (3, 32, 32)}, r"looks like PyTorch's \(C, H, W\); .* pass \(32, 32, 3\)"),
    ({"input_shape": (2, 1, 28, 28)}, r"\(1, 28, 28\) looks like .* pass \(28, 28, 1\)"),
])
def test_bad_arguments_say_what_to_pass(kwargs, message):
    with pytest.raises(ValueError, match=message):
        blueprint.summary(zoo.resnet18(), **kwargs)


def test_the_cli_refuses_a_channels_first_shape_with_the_nhwc_one(capsys):
    assert main(["plan", "resnet18", "--batch", "1", "--input-shape", "3,32,32"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "pass (32, 32, 3)" in err and err.count("\n") == 1, err


def test_the_guide_shows_the_real_output():
    from pathlib import Path
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "dsl-and-zoo.md").read_text(encoding="utf-8")
    call = ">>> print(blueprint.summary(blueprint.zoo.resnet18(), (224, 224, 3), depth=1))\n"
    shown = guide.split(call, 1)[1].split("```", 1)[0].rstrip("\n")
    assert shown == blueprint.summary(zoo.resnet18(), (224, 224, 3), depth=1)
