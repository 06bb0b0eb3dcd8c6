"""CPU training-step speed: blueprint-nn's CpuExecutor against PyTorch, side by side in one run.

Same process, same thread count (numba's, the BLAS libraries' and torch's), same shapes, same
weights. The two are timed in turn, ours then PyTorch's, `--repeats` times after a warm-up,
so that a machine whose speed drifts (a shared one) slows both alike; the times are medians
and the ratio is the median of the pairwise ratios ours / PyTorch's (lower is better; < 1
means we are faster).
PyTorch runs its CNNs in channels_last, the layout we compute in. Before timing, each case
checks that both give the same eval logits from the same weights.

    python benchmarks/cpu_vs_torch.py [--threads 2] [--repeats 7] [--only mlp,resnet20,resnet50]

Prints a Markdown table (README's "CPU performance" section is its output).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests.support.torch_models

#: The targets of the CPU-path issue: our step time / PyTorch's, or None (reported only).
CASES = [
    # (name, zoo model, torch model, input (N, H, W, C), what is timed, target ratio)
    ("mlp 784-1024-512-256-10, batch 128, train step", "mlp", "mlp", (128, 1, 1, 784), "train", 1.2),
    ("resnet20, batch 128, 32x32x3, train step", "resnet20", "resnet20", (128, 32, 32, 3), "train", 1.5),
    ("resnet50, batch 8, 224x224x3, forward (eval)", "resnet50", "resnet50", (8, 224, 224, 3), "forward", None),
]
MLP_SIZES = [784, 1024, 512, 256, 10]


def _limit_threads_before_imports(threads: int) -> None:
    """BLAS libraries read their thread count when they load: set it before numpy and torch do."""
    for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[name] = str(threads)


def _build(model, torch_model, shape, what):
    import numpy as np
    import torch

    from tests.support import torch_models
    from blueprint import zoo
    from blueprint.optim import SGD
    from cpu_ref import CpuExecutor
    from planner import ArchPlan
    from planner.compiler import Compiler

    bp = zoo.mlp(MLP_SIZES) if model == "mlp" else getattr(zoo, model)()
    net = torch_models.mlp(MLP_SIZES) if torch_model == "mlp" else getattr(torch_models, torch_model)()
    n, h, w, c = shape
    plan = Compiler(ArchPlan.from_blueprint(bp, in_channels=c)).compile(
        {"train": shape, "eval": shape}, training=what == "train", optimizer_state_slots=1)
    ours = CpuExecutor(plan, optimizer=SGD().lr(0.01).momentum(0.9))
    net.load_state_dict({k: torch.tensor(v) for k, v in ours.state_dict().items()})
    flat = isinstance(net, torch.nn.Sequential)
    if not flat:
        net = net.to(memory_format=torch.channels_last)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, plan.value_shapes["eval"][plan.arch.output_value][1], n)
    xt = torch.tensor(x).reshape(n, -1) if flat else torch.tensor(x).permute(0, 3, 1, 2)  # NHWC memory = channels_last
    yt = torch.tensor(y)

    # correctness first: the same weights give the same eval logits
    net.eval()
    with torch.no_grad():
        expected = net(xt).numpy()
    error = float(np.abs(ours.forward(x) - expected).max() / max(np.abs(expected).max(), 1e-6))
    if error > 1e-3:
        raise AssertionError(f"{model}: logits differ from PyTorch's (relative error {error:.2e}); timing skipped")

    if what == "forward":
        def torch_step():
            with torch.no_grad():
                net(xt)
        return (lambda: ours.forward(x)), torch_step

    net.train()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def torch_step():
        optimizer.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(net(xt), yt).backward()
        optimizer.step()

    return (lambda: ours.train_step(x, y, 0.01)), torch_step


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure_side_by_side(ours, theirs, repeats: int, warmup: int = 2) -> tuple[float, float, float]:
    """Median seconds of each, timed alternately, and the median of the pairwise ratios."""
    for _ in range(warmup):
        ours(), theirs()
    pairs = [(_seconds(ours), _seconds(theirs)) for _ in range(repeats)]
    return (statistics.median(o for o, _ in pairs), statistics.median(t for _, t in pairs),
            statistics.median(o / t for o, t in pairs))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", default="", help="comma-separated substrings of case names")
    args = parser.parse_args(argv)
    _limit_threads_before_imports(args.threads)
    import torch   # before cpu_ref, so that torch's OpenMP keeps its own defaults (cpu_ref makes numba's passive)
    import numba
    numba.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)

    print("| case | ours (ms) | PyTorch (ms) | ratio | target |")
    print("|---|---:|---:|---:|---|")
    for name, model, torch_model, shape, what, target in CASES:
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        ours_s, torch_s, ratio = measure_side_by_side(*_build(model, torch_model, shape, what), repeats=args.repeats)
        verdict = "-" if target is None else f"<= {target} ({'met' if ratio <= target else 'NOT met'})"
        print(f"| {name} | {ours_s * 1e3:.1f} | {torch_s * 1e3:.1f} | {ratio:.2f} | {verdict} |", flush=True)
    print(f"\n{args.threads} thread(s) for numba, BLAS and torch {torch.__version__}; medians of {args.repeats} "
          f"alternating runs; {platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())} (this run included)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
