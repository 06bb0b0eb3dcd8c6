"""A small network whose unfused plan holds every primitive kind of the op table (`planner.ops.Prim`).

The coverage tests build an executor (or an exporter) for it: every kind in every direction a
path runs is then asked of that path's kernel table. `test_every_kind_network_covers_the_table`
(tests/null/test_op_table.py) fails when a kind is added to the table but not to this network;
activations join by themselves (their DSL factory has the kind's name).
"""
import blueprint
from blueprint import (BluePrint, add2, avgpool, bn, channel_padding, conv, drop_path, dropout, fc, flatten, gap,
                       identity, maxpool, prelu, relu, se, seq)
from planner.ops import ACTIVATIONS

IN_CHANNELS = 3
INPUT_SHAPE = (2, 8, 8, IN_CHANNELS)   # (N, H, W, C) of the train and eval variants


def every_kind() -> BluePrint:
    pointwise = [getattr(blueprint, kind.value)() for kind in ACTIVATIONS]   # each DSL factory is named as its kind
    return BluePrint(seq(
        conv(8, 3, 1, 1), bn(), relu(), *pointwise, prelu(8), dropout(0.25),
        add2(identity(), seq(conv(8, 3, 1, 1), bn(), drop_path(0.5))),
        se(4),   # gap -> fc -> relu -> fc -> sigmoid -> channel_mul
        maxpool(2, 2), avgpool(2, 2, 1), channel_padding(16),
        add2(seq(gap(), fc(12)), seq(flatten(), fc(12, bias=False))), bn(), prelu(), fc(5),
    ), "every_kind")


def every_kind_plan(amp: bool = False):
    from planner import ArchPlan
    from planner.compiler import Compiler

    arch = ArchPlan.from_blueprint(every_kind(), in_channels=IN_CHANNELS, amp=amp)
    return Compiler(arch).compile({"train": INPUT_SHAPE, "eval": INPUT_SHAPE})
