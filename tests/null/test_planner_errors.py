"""Planner errors: one table of bad models -> the exception and the words its message must hold
(what was expected, what was found, where, and the fix)."""
from __future__ import annotations

import pytest

from blueprint import (
    BlockStyle, BluePrint, add2, block, cbr, conv, fc, flatten, gap, group_conv, identity, maxpool, named, relu, seq,
)
from planner import ArchPlan, ExpandError
from planner.compiler import Compiler
from planner.ops import ShapeError

TRAIN = {"train": (2, 8, 8, 3)}

# (id, root, from_blueprint options, variants, exception, message fragments)
BAD_MODELS = [
    ("conv-kernel-larger-than-input", seq(conv(8, 3, 1, 1), conv(8, 11, 1, 0), gap(), fc(2)), {}, TRAIN, ShapeError,
     ["seq[1].conv", "conv with kernel 11x11", "(2, 8, 8, 8)", "at least 11x11", "smaller kernel or a larger input"]),
    ("pool-window-larger-than-input", seq(conv(4, 3, 2, 1), maxpool(3, 2), maxpool(3, 2), gap(), fc(2)), {}, TRAIN,
     ShapeError, ["seq[2].maxpool", "maxpool with kernel 3x3", "(2, 1, 1, 4)"]),
    ("add2-spatial-mismatch", seq(add2(identity(), conv(3, 3, 2, 1)), gap(), fc(2)), {}, TRAIN, ShapeError,
     ["seq[0].add2", "lhs (shortcut) (2, 8, 8, 3)", "rhs (main) (2, 4, 4, 3)", "make the shortcut match"]),
    ("add2-channel-mismatch", seq(add2(identity(), conv(16, 3, 1, 1)), gap(), fc(2)), {}, TRAIN, ExpandError,
     ["seq[0].add2", "lhs gives 3 channels", "rhs gives 16 channels", "same channel count"]),
    ("input-channels-disagree", seq(conv(8, 3, 1, 1), gap(), fc(2)), {}, {"train": (2, 8, 8, 1)}, ShapeError,
     ["variant 'train'", "expanded for 3 input channels", "(2, 8, 8, 1) has 1", "in_channels=1"]),
    ("variant-not-nhwc", seq(conv(8, 3, 1, 1), gap(), fc(2)), {}, {"eval": (2, 8, 8)}, ShapeError,
     ["variant 'eval'", "(N, H, W, C) of positive ints", "(2, 8, 8)"]),
    ("fc-after-flatten-features-differ", seq(conv(4, 3, 1, 1), flatten(), fc(2)), {},
     {"train": (2, 8, 8, 3), "eval": (2, 16, 16, 3)}, ShapeError,
     ["seq[2].fc", "parameter shapes differ between variants", "'train'", "(2, 256)", "'eval'", "(2, 1024)"]),
    ("ends-nhwc", seq(conv(8, 3, 1, 1), relu()), {}, TRAIN, ExpandError,
     ["seq[1].relu", "must end with (N, classes) logits", "end it with gap() + fc(classes)"]),
    ("nhwc-op-after-flatten", seq(flatten(), conv(8, 3, 1, 1), fc(2)), {}, TRAIN, ExpandError,
     ["seq[1].conv", "conv needs an NHWC (4-D) input", "move it before the flatten/gap/fc"]),
    ("groups-do-not-divide-input", seq(group_conv(8, 2, 3, 1, 1), gap(), fc(2)), {}, TRAIN, ExpandError,
     ["seq[0].group_conv", "divisible by groups=2", "in=3, out=8"]),
    ("fuse-without-amp", seq(cbr(8, 3, 1, 1), gap(), fc(2)), {"fuse": True}, TRAIN, ValueError,
     ["fuse=True) needs amp=True", "fp16-only", "fuse=False"]),
    ("fused-output-not-multiple-of-8", seq(cbr(12, 3, 1, 1), gap(), fc(2)), {"fuse": True, "amp": True}, TRAIN,
     ExpandError, ["seq[0].cbr.conv", "multiples of 8", "output has 12", "channel_padding(8)"]),
    ("fused-input-not-multiple-of-8", seq(conv(12, 3, 1, 1), block(16, BlockStyle.RESNET_3_3), gap(), fc(2)),
     {"fuse": True, "amp": True}, TRAIN, ExpandError, ["seq[1].block.conv1", "input has 12"]),
    ("duplicate-parameter-names", seq(named("stem", conv(8, 3, 1, 1)), named("stem", conv(8, 3, 1, 1)), gap(), fc(2)),
     {}, TRAIN, ShapeError, ["same parameter names", "'stem.weight'", "named('...', ...)"]),
]


@pytest.mark.parametrize("root, options, variants, exception, fragments", [row[1:] for row in BAD_MODELS],
                         ids=[row[0] for row in BAD_MODELS])
def test_bad_models_raise_a_clear_error(root, options, variants, exception, fragments):
    with pytest.raises(exception) as caught:
        Compiler(ArchPlan.from_blueprint(BluePrint(root), **options)).compile(variants)
    assert type(caught.value) is exception
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_each_bad_model_is_fixed_by_the_change_its_message_suggests():
    """The table's models differ from valid ones only in the mistake: these neighbours compile."""
    good = [
        (seq(conv(8, 3, 1, 1), conv(8, 7, 1, 0), gap(), fc(2)), {}, TRAIN),
        (seq(add2(conv(3, 1, 2, 0), conv(3, 3, 2, 1)), gap(), fc(2)), {}, TRAIN),
        (seq(conv(4, 3, 1, 1), flatten(), fc(2)), {}, {"train": (2, 8, 8, 3), "eval": (5, 8, 8, 3)}),
        (seq(cbr(16, 3, 1, 1), gap(), fc(2)), {"fuse": True, "amp": True}, TRAIN),
        (seq(named("stem", conv(8, 3, 1, 1)), named("stem2", conv(8, 3, 1, 1)), gap(), fc(2)), {}, TRAIN),
    ]
    for root, options, variants in good:
        Compiler(ArchPlan.from_blueprint(BluePrint(root), **options)).compile(variants).verify()


def test_from_blueprint_and_compile_check_their_arguments():
    bp = BluePrint(seq(conv(8, 3, 1, 1), gap(), fc(2)))
    with pytest.raises(TypeError, match=r"expected a BluePrint, got Layer; wrap the layer as BluePrint\(layer\)"):
        ArchPlan.from_blueprint(bp.root)
    with pytest.raises(TypeError, match=r"expected a BluePrint, got list, e.g. BluePrint\(seq\(...\)\)"):
        ArchPlan.from_blueprint([conv(8, 3)])
    with pytest.raises(ValueError, match="the BluePrint is empty"):
        ArchPlan.from_blueprint(BluePrint())
    with pytest.raises(ValueError, match="expected a positive int"):
        ArchPlan.from_blueprint(bp, in_channels=0)
    with pytest.raises(TypeError, match="expected an ArchPlan"):
        Compiler(bp)
    with pytest.raises(ValueError, match="at least one variant"):
        Compiler(ArchPlan.from_blueprint(bp)).compile({})
    with pytest.raises(ValueError, match="optimizer_state_slots"):
        Compiler(ArchPlan.from_blueprint(bp)).compile(TRAIN, optimizer_state_slots=3)
