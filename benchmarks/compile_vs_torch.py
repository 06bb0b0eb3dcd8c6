"""Time to a runnable training step: blueprint-nn's planner against torch.compile, side by side.

One model and batch (default: resnet20, batch 128, 32x32x3, the case the planner issue names),
both measured in this one process on this machine:

- ours: `ArchPlan.from_blueprint` + `Compiler.compile` with a train and an eval variant, the
  planning a new model or input shape costs; median wall time of `--repeats` fresh compiles. The
  numba kernels the plan runs on are generic (not per model): they are compiled once per machine
  and cached on disk, so they are not in this figure (the README says what a cold cache costs).
- PyTorch: the first call of `torch.compile(step)` (forward, cross-entropy, backward, SGD step)
  minus the time of one eager step, first with inductor's on-disk caches in a fresh temporary
  directory (cold: a model this machine has not compiled before), then after
  `torch._dynamo.reset()` with those caches warm (a rerun of the same model and shapes).

    python -m benchmarks.compile_vs_torch [--model resnet20|mlp] [--batch 128] [--repeats 21]

Prints a Markdown table with the ratios PyTorch / ours (higher means our planner is faster).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from blueprint import zoo

MODELS = ("resnet20", "mlp")   # zoo models with a PyTorch twin of the same name (default arguments on both sides)


def ours_ms(model: str, batch: int, repeats: int) -> tuple[float, int]:
    """(median wall ms of a full plan compile, trainable parameters)."""
    from planner import ArchPlan
    from planner.compiler import Compiler

    h, w, c = zoo.MODELS[model].input_shape
    bp = zoo.MODELS[model].build()
    variants = {"train": (batch, h, w, c), "eval": (batch, h, w, c)}
    times, plan = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        plan = Compiler(ArchPlan.from_blueprint(bp, in_channels=c)).compile(variants)
        times.append(time.perf_counter() - start)
    plan.verify()
    return statistics.median(times) * 1e3, plan.params_trainable


def torch_seconds(model: str, batch: int) -> dict[str, float]:
    """Eager step, and torch.compile's first call minus an eager step with cold and warm caches."""
    import torch
    import torch.nn.functional as F

    from tests.support import torch_models

    h, w, c = zoo.MODELS[model].input_shape
    net = getattr(torch_models, model)().train()
    if model == "mlp":
        x = torch.randn(batch, h * w * c)
    else:
        net = net.to(memory_format=torch.channels_last)
        x = torch.randn(batch, c, h, w).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        return loss

    step()                                    # eager warm-up (allocator, kernels, momentum buffers)
    eager = min(_seconds(step) for _ in range(3))
    cold = _seconds(torch.compile(step)) - eager
    torch._dynamo.reset()
    warm = _seconds(torch.compile(step)) - eager
    return {"eager_step": eager, "cold": cold, "warm": warm, "params": sum(p.numel() for p in net.parameters())}


def _seconds(fn) -> float:
    start = time.perf_counter()
    loss = fn()
    if not bool(loss.isfinite()):
        raise RuntimeError(f"the timed PyTorch step gave a non-finite loss ({loss.item()})")
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="resnet20")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=21, help="fresh plan compiles to take the median of")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.repeats < 1:
        parser.error(f"--batch and --repeats must be positive, got {args.batch} and {args.repeats}")
    with tempfile.TemporaryDirectory(prefix="inductor-cold-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache        # read when inductor first compiles
        ours, our_params = ours_ms(args.model, args.batch, args.repeats)
        theirs = torch_seconds(args.model, args.batch)
    if theirs["params"] != our_params:
        raise SystemExit(f"{args.model}: the PyTorch twin has {theirs['params']:,} parameters, our plan "
                         f"{our_params:,}: not the same network")
    h, w, c = zoo.MODELS[args.model].input_shape
    print(f"{args.model}, batch {args.batch}, {h}x{w}x{c}, {our_params:,} parameters; one eager PyTorch step "
          f"{theirs['eager_step'] * 1e3:.0f} ms")
    print("| what | time | PyTorch / ours |")
    print("|---|--:|--:|")
    print(f"| ours: plan (expand + compile, train and eval), median of {args.repeats} | {ours:.1f} ms | |")
    for key, label in (("cold", "torch.compile first call, cold caches"), ("warm", "torch.compile after reset, warm caches")):
        print(f"| {label}, minus one eager step | {theirs[key]:.1f} s | {theirs[key] * 1e3 / ours:,.0f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
