"""Golden plans: the ArchPlan text and the compiled schedule of five small networks, checked in
under tests/null/golden/.

Each golden file was produced once by `summary()` and then read line by line by hand before it
was checked in: the shortcut each block chose (identity when stride 1 and in == out channels,
else a 1x1 projection named `downsample.0/1`), torchvision-style parameter names, bn2d after
NHWC values and bn1d after (N, F) ones, the implicit flatten before an fc on an NHWC value (and
the fc weight's `fc_hwc` layout with the flattened (H, W, C)), the single softmax-CE loss head,
the AMP input padding to 8 channels (and, for a stem, the upload slot with the real channels
beside it), the fused merges (conv + bn + relu -> cbr, blocks -> basic_block / inv_residual with
shortcut identity/projection/none, gap + fc -> gap_fc), which
values are saved for backward versus transient (in eval graphs a maxpool's argmax is a one-op
forward workspace `argmax_f`: the forward kernel writes it there too, nothing reads it), and the
backward order (reverse of forward, no input gradient for the first layer, gradient accumulation
where a value has two uses).
One oddity was left as found and reported: a fused InvResidual without a shortcut takes the
name of its last BN (`2.conv.3` in tiny_mobilenet_fused), one with a shortcut the block's (`1`).

A diff here means the planner's output changed. If the change is intended, regenerate with
`BLUEPRINT_UPDATE_GOLDEN=1 pytest tests/null/test_planner_golden.py`, then read the new files
by hand the same way before checking them in.
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from blueprint import (
    BlockStyle, BluePrint, block, bn, cbr, conv, dropout, fc, gap, gap_fc, maxpool, mbconv, named, relu, seq, zoo,
)
from planner import ArchPlan
from planner.compiler import Compiler
from planner.plan import INPUT_GRADIENTS

GOLDEN = Path(__file__).parent / "golden"
# the io slots printed: the batch (its channels padded under AMP), and where a stem reads it padded the batch as
# uploaded, with its real channels (the CUDA path pads it on the device)
IO_SLOTS = ("input", "labels", "logits", "input_unpadded")
UPDATE = os.environ.get("BLUEPRINT_UPDATE_GOLDEN") == "1"

TINY_RESNET = BluePrint(seq(
    named("conv1", conv(8, 3, 1, 1)), named("bn1", bn()), relu(),
    named("layer1", seq(block(8, BlockStyle.RESNET_3_3), block(16, BlockStyle.RESNET_3_3_DS))),
    gap(), named("fc", fc(4))), "tiny_resnet")
FEATURES_HEAD = BluePrint(seq(conv(4, 3, 1, 1), relu(), maxpool(2, 2), fc(6), bn(), relu(), dropout(0.5), fc(3)),
                          "features_head")
TINY_MOBILENET = BluePrint(seq(cbr(8, 3, 2, 1), mbconv(1, 8, 1), mbconv(6, 16, 2), mbconv(6, 16, 1), gap_fc(5)),
                           "tiny_mobilenet")

# (file stem, blueprint, (H, W, C), fuse)
CASES = [
    ("tiny_resnet", TINY_RESNET, (8, 8, 3), False),
    ("tiny_resnet_fused", TINY_RESNET, (8, 8, 3), True),
    ("features_head", FEATURES_HEAD, (4, 4, 2), False),
    ("tiny_mobilenet_fused", TINY_MOBILENET, (8, 8, 3), True),
    ("small_cnn_fused", zoo.small_cnn(), (8, 8, 1), True),
]


def _roles(accesses, names) -> str:
    return " ".join(f"{operand.label}={names[operand.tensor]}" for operand in accesses) or "-"


def _attrs(op) -> str:
    """The op's attributes, then whether each input gradient adds onto an earlier op's."""
    accumulate = [(f"accumulate_{o.label}", o.accumulate) for o in op.writes if o.role in INPUT_GRADIENTS]
    return " ".join(f"{k}={v}" for k, v in op.attrs + tuple(accumulate))


def summary(bp: BluePrint, hwc: tuple[int, int, int], fuse: bool) -> str:
    """The ArchPlan text, the parameters, every step-local tensor and both schedules, by name."""
    arch = ArchPlan.from_blueprint(bp, in_channels=hwc[2], fuse=fuse, amp=fuse)
    plan = Compiler(arch).compile({"train": (2, *hwc), "eval": (1, *hwc)})
    plan.verify()
    names = {t.id: t.name for t in plan.tensors}
    lines = [f"# {bp.name}: input {hwc}, fuse={fuse}, amp={fuse}, input channels padded to {arch.input_channels_padded}",
             "passes: " + ", ".join(arch.passes),
             "io: " + " ".join(f"{name}={plan.tensor(tid).variant_shapes or plan.tensor(tid).shape}"
                               for name, tid in plan.io.items() if name in IO_SLOTS),
             "", "## layers", arch.describe(), "", "## parameters"]
    lines += [f"{p.name} {p.shape} {p.region} {p.init} {p.torch_layout or '-'}"
              + (f" flatten_from={p.flatten_from}" if p.flatten_from else "") for p in plan.params]
    for name, graph in plan.graphs.items():
        lines += ["", f"## graph {name} (backward starts at op {graph.boundary})"]
        for t in plan.tensors:
            if t.graph == name:
                lines.append(f"tensor {t.name} {t.region} {t.dtype} " + " ".join(f"{v}={s}" for v, s in t.variant_shapes))
        for op in graph.ops:
            if op.kind == "optimizer":
                reads = " ".join(f"{role}x{n}" for role, n in Counter(o.label for o in op.reads).items())
                writes = " ".join(f"{role}x{n}" for role, n in Counter(o.label for o in op.writes).items())
            else:
                reads, writes = _roles(op.reads, names), _roles(op.writes, names)
            attrs = _attrs(op)
            lines.append(f"op {op.index} {op.direction} {op.kind} {op.name}: reads {reads} | writes {writes}"
                         + (f" | {attrs}" if attrs else ""))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("pure_python", [False, True], ids=["as-built", "pure-python"])
@pytest.mark.parametrize("stem, bp, hwc, fuse", CASES, ids=[c[0] for c in CASES])
def test_plan_matches_the_hand_reviewed_golden_file(stem, bp, hwc, fuse, pure_python, monkeypatch):
    """Both builds of the planner's Cython modules: compiled where it is built, and their source."""
    monkeypatch.setenv("BLUEPRINT_PURE_PYTHON", "1" if pure_python else "0")
    text = summary(bp, hwc, fuse)
    path = GOLDEN / f"{stem}.txt"
    if UPDATE and not pure_python:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing; generate it with BLUEPRINT_UPDATE_GOLDEN=1 and review it by hand"
    assert text == path.read_text()
