"""A small network whose unfused plan holds every primitive kind of the op table (`planner.ops.Prim`).

The coverage tests build an executor (or an exporter) for it: every kind in every direction a
path runs is then asked of that path's kernel table. `test_every_kind_network_covers_the_table`
(tests/null/test_op_table.py) fails when a kind is added to the table but not to this network.
"""
from blueprint import (BluePrint, add2, avgpool, bn, channel_padding, conv, dropout, fc, flatten, gap, gelu,
                       hardswish, identity, leaky_relu, maxpool, relu, relu6, seq, sigmoid, silu, tanh)

IN_CHANNELS = 3
INPUT_SHAPE = (2, 8, 8, IN_CHANNELS)   # (N, H, W, C) of the train and eval variants


def every_kind() -> BluePrint:
    pointwise = [relu6(), leaky_relu(0.1), sigmoid(), tanh(), silu(), hardswish(), gelu()]
    return BluePrint(seq(
        conv(8, 3, 1, 1), bn(), relu(), *pointwise, dropout(0.25),
        add2(identity(), seq(conv(8, 3, 1, 1), bn())),
        maxpool(2, 2), avgpool(2, 2, 1), channel_padding(16),
        add2(seq(gap(), fc(12)), seq(flatten(), fc(12, bias=False))), bn(), relu(), fc(5),
    ), "every_kind")


def every_kind_plan(amp: bool = False):
    from planner import ArchPlan
    from planner.compiler import Compiler

    arch = ArchPlan.from_blueprint(every_kind(), in_channels=IN_CHANNELS, amp=amp)
    return Compiler(arch).compile({"train": INPUT_SHAPE, "eval": INPUT_SHAPE})
