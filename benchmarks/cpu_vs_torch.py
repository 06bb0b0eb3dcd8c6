"""CPU training-step speed: blueprint-nn's CpuExecutor against PyTorch, side by side in one run.

Same machine, same thread count (numba's and torch's), same shapes, same weights; each
figure is the median of `--repeats` timed calls after warm-up. Ratios are ours / PyTorch
(lower is better; < 1 means we are faster). PyTorch runs channels_last for the CNNs.

    python benchmarks/cpu_vs_torch.py [--threads 2] [--repeats 5] [--only mlp,resnet20,resnet50]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _median_seconds(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cases():
    """(name, our blueprint factory, torch model factory, input (N, H, W, C), what is timed)."""
    import torch_models
    from blueprint import zoo
    return [
        ("mlp 784-1024-512-256-10, batch 128, train step", lambda: zoo.mlp([784, 1024, 512, 256, 10]),
         lambda: torch_models.mlp([784, 1024, 512, 256, 10]), (128, 1, 1, 784), "train"),
        ("resnet20, batch 128, 32x32, train step", zoo.resnet20, torch_models.resnet20, (128, 32, 32, 3), "train"),
        ("resnet50, batch 8, 224x224, forward (eval)", zoo.resnet50, torch_models.resnet50, (8, 224, 224, 3), "forward"),
    ]


def run_case(name, make_bp, make_torch, shape, what, repeats, threads):
    import numpy as np
    import torch
    import torch.nn.functional as F

    from blueprint.optim import SGD
    from cpu_ref import CpuExecutor
    from planner import ArchPlan
    from planner.compiler import Compiler

    n, h, w, c = shape
    plan = Compiler(ArchPlan.from_blueprint(make_bp(), in_channels=c)).compile(
        {"train": shape, "eval": shape}, training=what == "train")
    ours = CpuExecutor(plan, optimizer=SGD().lr(0.01).momentum(0.9))
    net = make_torch()
    net.load_state_dict({k: torch.tensor(v) for k, v in ours.state_dict().items()})
    flat = isinstance(net, torch.nn.Sequential)
    if not flat:
        net = net.to(memory_format=torch.channels_last)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, plan.value_shapes["eval"][plan.arch.output_value][1], n)
    xt = torch.tensor(x).reshape(n, -1) if flat else torch.tensor(x).permute(0, 3, 1, 2)  # NHWC memory = channels_last
    yt = torch.tensor(y)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    if what == "train":
        net.train()

        def torch_step():
            optimizer.zero_grad(set_to_none=False)
            F.cross_entropy(net(xt), yt).backward()
            optimizer.step()

        def our_step():
            ours.train_step(x, y, 0.01)
    else:
        net.eval()

        def torch_step():
            with torch.no_grad():
                net(xt)

        def our_step():
            ours.forward(x)

    # correctness first: the same weights give the same eval logits
    net.eval()
    with torch.no_grad():
        expected = net(xt).numpy()
    got = ours.forward(x)
    error = float(np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-6))
    if error > 1e-3:
        raise AssertionError(f"{name}: logits differ from PyTorch's (relative error {error:.2e}); timing skipped")
    if what == "train":
        net.train()
    ours_s = _median_seconds(our_step, repeats)
    torch_s = _median_seconds(torch_step, repeats)
    return ours_s, torch_s


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated substrings of case names")
    args = parser.parse_args(argv)
    import numba
    import torch
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(args.threads)
    rows = []
    for case in cases():
        if args.only and not any(part in case[0] for part in args.only.split(",")):
            continue
        ours_s, torch_s = run_case(*case, repeats=args.repeats, threads=args.threads)
        rows.append((case[0], ours_s, torch_s))
        print(f"{case[0]:<48} ours {ours_s * 1e3:9.1f} ms   torch {torch_s * 1e3:9.1f} ms   ratio {ours_s / torch_s:5.2f}",
              flush=True)
    print(f"\nthreads={args.threads} (numba and torch), torch {torch.__version__}, median of {args.repeats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
