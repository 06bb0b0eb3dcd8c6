"""`Compiler(arch).compile(variants=...)`: five named phases from an ArchPlan to a CompiledPlan.

    infer_shapes    concrete NHWC shapes of every value, per variant; parameter shapes
    build_graph     the persistent tensors, then the op schedules (train: forward, loss, backward,
                    optimizer; eval: forward, loss) over tensor ids, with each tensor's shape in
                    each variant (planner.schedule, one small function per phase)
    size_slot       every tensor slot gets the largest size over the variants of its graph (applied
                    by planner.schedule to each tensor it makes)
    plan_memory     persistent regions laid out once; saved and transient tensors get offsets
                    from their lifetimes over the schedule (planner.memory)
    share_variants  variants of one graph share its schedule and offsets; equal shapes share
                    one shape signature (the key for captured CUDA graphs)

A variant's graph is `train` when its name starts with "train" (and training=True), else `eval`.
"""
from __future__ import annotations

import contextlib
import gc
import math
import time
from dataclasses import replace

import numpy as np

from planner._arch import NETWORK_INPUT, ArchPlan
from planner.memory import plan_memory
from planner.plan import CompiledPlan, Shape, VariantPlan
from planner.ops import OPS, ParamRule, ShapeError
from planner.schedule import build_graph, persistent_tensors, primitive_list, setting_for


# ---- phase 1 ------------------------------------------------------------------------------------
def infer_shapes(arch: ArchPlan, variants: dict[str, Shape]) -> tuple[dict[str, dict[int, Shape]], dict]:
    """Shapes of every value per variant, and every primitive's parameter shapes (equal across variants)."""
    value_shapes: dict[str, dict[int, Shape]] = {}
    param_shapes: dict[int, list[tuple[ParamRule, Shape]]] = {}
    seen_in: dict[int, tuple[str, Shape]] = {}
    prims = [(OPS[prim.kind], prim) for _, prim in primitive_list(arch)]
    for variant, shape in variants.items():
        shape = tuple(shape)
        if len(shape) != 4 or any(not isinstance(d, (int, np.integer)) or d < 1 for d in shape):
            raise ShapeError(f"variant {variant!r}: expected an input shape (N, H, W, C) of positive ints, got {shape!r}")
        if shape[3] != arch.in_channels:
            raise ShapeError(f"variant {variant!r}: the plan was expanded for {arch.in_channels} input channels, "
                             f"but the variant's input shape {shape} has {shape[3]}; pass in_channels={shape[3]} "
                             f"to ArchPlan.from_blueprint")
        shapes = {NETWORK_INPUT: shape}
        for position, (rule, prim) in enumerate(prims):
            ins = [shapes[v] for v in prim.inputs]
            shapes[prim.output] = rule.shape(prim, ins)
            params = rule.params(prim, ins)
            if position not in param_shapes:
                param_shapes[position] = params
                seen_in[position] = (variant, ins[0])
            elif params != param_shapes[position]:
                first_variant, first_in = seen_in[position]
                raise ShapeError(f"{prim.path}: parameter shapes differ between variants: {first_variant!r} "
                                 f"(input {first_in}) gives {[s for _, s in param_shapes[position]]}, {variant!r} "
                                 f"(input {ins[0]}) gives {[s for _, s in params]}; variants must agree on every "
                                 f"shape that reaches a parameter (e.g. the features entering an fc)")
        _check_addressable(variant, shape, shapes, param_shapes)
        value_shapes[variant] = shapes
    return value_shapes, param_shapes


#: Bytes one plan may address at most: offsets are int64, and a tensor's bytes, its gradient's and
#: their sum must all stay in range.
LARGEST_ARENA_BYTES = 2**60


def _check_addressable(variant, input_shape, shapes, param_shapes) -> None:
    elements = sum(math.prod(s) for s in shapes.values())
    elements += sum(math.prod(s) for params in param_shapes.values() for _, s in params)
    if elements * 8 > LARGEST_ARENA_BYTES:  # fp32 values and their gradients
        raise ShapeError(f"variant {variant!r}: input shape {input_shape} makes the network's tensors hold "
                         f"{elements:.3g} values, more than one plan can address (2**60 bytes); lower the "
                         f"batch size, the image size or the layer widths")


class Compiler:
    """Compile an ArchPlan for a set of input shapes (variants).

    >>> from blueprint import zoo
    >>> from planner import ArchPlan
    >>> arch = ArchPlan.from_blueprint(zoo.resnet20())
    >>> plan = Compiler(arch).compile(variants={"train": (8, 32, 32, 3), "eval": (4, 32, 32, 3)})
    >>> plan.params_trainable
    272474
    """

    def __init__(self, arch: ArchPlan):
        if not isinstance(arch, ArchPlan):
            raise TypeError(f"Compiler(arch): expected an ArchPlan, got {type(arch).__name__}")
        self.arch = arch

    def compile(self, variants: dict[str, Shape], training: bool = True, optimizer_state_slots: int = 1) -> CompiledPlan:
        start = time.perf_counter()
        with _cyclic_gc_paused():
            plan = self._compile(variants, training, optimizer_state_slots)
        return replace(plan, compile_ms=(time.perf_counter() - start) * 1e3)

    def _compile(self, variants, training, optimizer_state_slots) -> CompiledPlan:
        if not variants:
            raise ValueError("Compiler.compile(variants): give at least one variant, e.g. {'train': (32, 32, 32, 3)}")
        if optimizer_state_slots not in (0, 1, 2):
            raise ValueError(f"Compiler.compile(optimizer_state_slots): expected 0, 1 or 2, got {optimizer_state_slots}")
        arch = self.arch
        variants = {name: tuple(shape) for name, shape in variants.items()}
        variants_of: dict[str, list[str]] = {}
        for name in variants:
            graph = "train" if training and name.startswith("train") else "eval"
            variants_of.setdefault(graph, []).append(name)
        value_shapes, param_shapes = infer_shapes(arch, variants)                        # 1
        act_dtype = "float16" if arch.amp else "float32"
        s = setting_for(arch, value_shapes, variants_of, act_dtype, training, optimizer_state_slots if training else 0)
        persistent = persistent_tensors(s, param_shapes)                                 # 4 (and 2)
        graphs, tensors = {}, list(persistent.tensors)
        for graph in sorted(variants_of, reverse=True):
            graphs[graph], made = build_graph(s, persistent, graph, len(tensors))
            tensors += made
        tensors, memory = plan_memory(tensors, graphs, persistent.params)                # 3
        variant_plans = share_variants(variants, variants_of, tensors)                   # 5
        macs = {}
        for position, (_, prim) in enumerate(s.prims):
            shapes = value_shapes[next(iter(variants))]
            ins = [shapes[v] for v in prim.inputs]
            out = shapes[prim.output]
            macs[position] = OPS[prim.kind].macs(prim, [(1,) + shape[1:] for shape in ins], (1,) + out[1:] if out else out)
        return CompiledPlan(arch, tuple(p for _, p in s.prims), variant_plans, value_shapes, graphs,
                            tuple(tensors), persistent.params, memory, dict(persistent.io), macs, act_dtype,
                            training, optimizer_state_slots if training else 0)


@contextlib.contextmanager
def _cyclic_gc_paused():
    """A compile allocates tens of thousands of small objects (tuples, named tuples, records) that
    reference counting frees or the plan keeps; left on, the cyclic collector walks them again and
    again (about a tenth of a ResNet-152 compile). Paused for the compile only and turned back on
    only if it was on; a cycle made meanwhile is collected by the next pass after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# ---- phase 5 ------------------------------------------------------------------------------------
def share_variants(variants, variants_of, tensors) -> dict[str, VariantPlan]:
    """Every shape in a graph follows from the input shape, so (graph, input shape) is the signature."""
    return {name: VariantPlan(name, graph, variants[name], (graph, variants[name]))
            for graph, names in variants_of.items() for name in names}
