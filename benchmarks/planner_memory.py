"""The memory plan's quality: transient bytes planned against the lower bound, every zoo model.

    python -m benchmarks.planner_memory              # the README's table (markdown)
    python -m benchmarks.planner_memory --batch 64

For each zoo model, its training variant (`{"train": (batch, H, W, C)}` at the zoo's input shape)
is compiled unfused fp32 (`ArchPlan.from_blueprint(bp)`) and fused AMP (`fuse=True, amp=True`).
The train graph's transient region is reported: the lower bound (the largest total of 256-byte
aligned transient bytes live at any op, which no placement can beat), the planned size (best
fit in the allocator's orders), their ratio (the target is <= 1.05) and the no-reuse total (every transient in
its own slot). The numbers are exact byte counts of the plan; nothing is timed.
"""
from __future__ import annotations

import argparse

from blueprint import zoo
from planner import ArchPlan
from planner.compiler import Compiler

TARGET = 1.05
MiB = 2**20


def transient_memory(model: str, batch: int, fuse: bool):
    """The train graph's GraphMemory of `model` in its training variant."""
    entry = zoo.MODELS[model]
    arch = ArchPlan.from_blueprint(entry.build(), in_channels=entry.input_shape[2], fuse=fuse, amp=fuse)
    plan = Compiler(arch).compile({"train": (batch, *entry.input_shape)})
    plan.verify()
    return plan.memory.graphs["train"]


def markdown_table(batch: int) -> str:
    lines = ["| model | input | lower bound (MiB) | planned (MiB) | ratio | no reuse (MiB) | fused AMP ratio |",
             "|---|---|--:|--:|--:|--:|--:|"]
    worst = 0.0
    for model, entry in zoo.MODELS.items():
        fp32, amp = transient_memory(model, batch, False), transient_memory(model, batch, True)
        ratios = [g.transient_planned_bytes / g.transient_lower_bound_bytes for g in (fp32, amp)]
        worst = max(worst, *ratios)
        lines.append(f"| {model} | {batch}x{'x'.join(map(str, entry.input_shape))} "
                     f"| {fp32.transient_lower_bound_bytes / MiB:,.1f} | {fp32.transient_planned_bytes / MiB:,.1f} "
                     f"| {ratios[0]:.3f} | {fp32.transient_no_reuse_bytes / MiB:,.1f} | {ratios[1]:.3f} |")
    verdict = "holds" if worst <= TARGET else "is missed"
    lines.append(f"\nworst ratio {worst:.3f}: the {TARGET} target {verdict}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    print(markdown_table(parser.parse_args().batch))
