"""Where a CPU training step spends its time: CpuExecutor's ops grouped by (direction, layer kind).

Wraps `CpuExecutor._run` with `time.perf_counter`, runs `--steps` steps after two warm-up steps and
prints, per group, the minimum over the steps of its summed time and its share of the sum of those
minima. The numba and BLAS thread counts are set before the imports, as in `cpu_vs_torch.py`.

    python -m benchmarks.cpu_op_profile [--model resnet20] [--batch 128] [--threads 1] [--steps 5]
"""
from __future__ import annotations

import argparse
import collections
import time


def profile(model: str, batch: int, steps: int) -> tuple[list[float], dict[tuple[str, str], list[float]]]:
    """Step seconds and, per (direction, kind), the seconds of each step."""
    import numpy as np

    from blueprint import zoo
    from blueprint.optim import SGD
    from cpu_ref import CpuExecutor
    from planner import ArchPlan
    from planner.compiler import Compiler

    bp = getattr(zoo, model)()
    shape = (batch, *zoo.MODELS[model].input_shape)
    plan = Compiler(ArchPlan.from_blueprint(bp, in_channels=shape[3])).compile(
        {"train": shape, "eval": shape}, training=True, optimizer_state_slots=1)
    ex = CpuExecutor(plan, optimizer=SGD().lr(0.01).momentum(0.9))
    current: dict[tuple[str, str], float] = collections.defaultdict(float)
    run = ex._run

    def timed_run(op, views, variant):
        start = time.perf_counter()
        run(op, views, variant)
        kind = "optimizer" if op.direction == "optimizer" else str(plan.arch.layers[op.layer].kind)
        current[(op.direction, kind)] += time.perf_counter() - start

    ex._run = timed_run
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, plan.value_shapes["eval"][plan.arch.output_value][1], batch)
    for _ in range(2):
        ex.train_step(x, y, 0.01)
    step_seconds, per_op = [], collections.defaultdict(list)
    for _ in range(steps):
        current.clear()
        start = time.perf_counter()
        ex.train_step(x, y, 0.01)
        step_seconds.append(time.perf_counter() - start)
        for key, seconds in current.items():
            per_op[key].append(seconds)
    return step_seconds, per_op


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    from benchmarks.cpu_vs_torch import limit_threads_before_imports
    limit_threads_before_imports(args.threads)
    step_seconds, per_op = profile(args.model, args.batch, args.steps)
    total = sum(min(v) for v in per_op.values())
    print(f"{args.model}, batch {args.batch}, {args.threads} thread(s): step {min(step_seconds) * 1e3:.1f} ms "
          f"(minimum of {args.steps})\n")
    print("| direction | kind | ms (minimum) | share |")
    print("|---|---|---:|---:|")
    for (direction, kind), seconds in sorted(per_op.items(), key=lambda item: -min(item[1])):
        print(f"| {direction} | {kind} | {min(seconds) * 1e3:.1f} | {100 * min(seconds) / total:.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
