"""CPU training-step speed: blueprint-nn's CpuExecutor against PyTorch, each in its own process.

Same shapes, same weights, same thread count for every thread pool of a process (numba's, the
BLAS libraries' and OpenMP's). Each round runs our side and PyTorch's in fresh processes, in
alternating order (`alternating.py`: in one process the two thread pools disturb each other);
a process warms up, then times `--steps` steps and reports their median. The ratio is ours /
PyTorch's per round (lower is better; < 1 means we are faster), quoted as the median over
`--rounds` with its min-max. PyTorch runs its CNNs in channels_last, the layout we compute in.
Before timing, a check process makes sure both give the same eval logits from the same weights
(and fills numba's cache for the target).

    python -m benchmarks.cpu_vs_torch [--threads 1,2] [--rounds 5] [--isa native,avx2] [--only resnet20]

`--isa avx2` is the AVX2 stand-in on an AVX-512 machine (`alternating.STANDINS`). Prints a
Markdown table per instruction set and what each side computed with (numba's target and vector
registers, ATen's capability, the BLAS kernel sets).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

#: The targets of the CPU-path issue: our step time / PyTorch's, or None (reported only).
CASES = [
    # (name, zoo model, torch model, input (N, H, W, C), what is timed, target ratio of issue 27)
    ("mlp 784-1024-512-256-10, batch 128, train step", "mlp", "mlp", (128, 1, 1, 784), "train", 0.6),
    ("resnet20, batch 128, 32x32x3, train step", "resnet20", "resnet20", (128, 32, 32, 3), "train", 1.0),
    ("resnet50, batch 8, 224x224x3, forward (eval)", "resnet50", "resnet50", (8, 224, 224, 3), "forward", 1.0),
]
MLP_SIZES = [784, 1024, 512, 256, 10]


def limit_threads_before_imports(threads: int) -> None:
    """BLAS libraries read their thread count when they load: set it before numpy and torch do."""
    for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[name] = str(threads)


def _build_ours(model, shape, what):
    """Our executor (weights from its seed), the batch, and our step."""
    import numpy as np

    from blueprint import zoo
    from blueprint.optim import SGD
    from cpu_ref import CpuExecutor
    from planner import ArchPlan
    from planner.compiler import Compiler

    bp = zoo.mlp(MLP_SIZES) if model == "mlp" else getattr(zoo, model)()
    n, h, w, c = shape
    plan = Compiler(ArchPlan.from_blueprint(bp, in_channels=c)).compile(
        {"train": shape, "eval": shape}, training=what == "train", optimizer_state_slots=1)
    ours = CpuExecutor(plan, optimizer=SGD().lr(0.01).momentum(0.9))
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, plan.value_shapes["eval"][plan.arch.output_value][1], n)
    step = (lambda: ours.forward(x)) if what == "forward" else (lambda: ours.train_step(x, y, 0.01))
    return ours, x, y, step


def build(model, torch_model, shape, what, check=True, with_torch=True):
    """``(our step, PyTorch's step)`` on the same weights and batch (PyTorch's is None without ``with_torch``);
    with ``check``, first that both give the same eval logits."""
    ours, x, y, our_step = _build_ours(model, shape, what)
    if not with_torch:
        return our_step, None
    import numpy as np
    import torch

    from tests.support import torch_models

    net = torch_models.mlp(MLP_SIZES) if torch_model == "mlp" else getattr(torch_models, torch_model)()
    net.load_state_dict({k: torch.tensor(v) for k, v in ours.state_dict().items()})
    flat = isinstance(net, torch.nn.Sequential)
    if not flat:
        net = net.to(memory_format=torch.channels_last)
    n = shape[0]
    xt = torch.tensor(x).reshape(n, -1) if flat else torch.tensor(x).permute(0, 3, 1, 2)  # NHWC memory = channels_last
    yt = torch.tensor(y)

    if check:   # correctness first: the same weights give the same eval logits
        net.eval()
        with torch.no_grad():
            expected = net(xt).numpy()
        error = float(np.abs(ours.forward(x) - expected).max() / max(np.abs(expected).max(), 1e-6))
        if error > 1e-3:
            raise AssertionError(f"{model}: logits differ from PyTorch's (relative error {error:.2e}); timing skipped")

    if what == "forward":
        net.eval()

        def torch_step():
            with torch.no_grad():
                net(xt)
        return our_step, torch_step

    net.train()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def torch_step():
        optimizer.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(net(xt), yt).backward()
        optimizer.step()

    return our_step, torch_step


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


def _case(key):
    return next(case for case in CASES if case[1] == key)


def _child(side: str, key: str, threads: int, steps: int, warmup: int) -> None:
    """One side of one round (or ``check``): prints one JSON line."""
    from benchmarks.alternating import runtime_info
    _, model, torch_model, shape, what, _ = _case(key)
    if side == "check":
        import torch
        torch.set_num_threads(threads)
        build(model, torch_model, shape, what)   # raises when the logits differ
        print(json.dumps({"ok": True}))
        return
    if side == "torch":
        import torch
        torch.set_num_threads(threads)
        _, step = build(model, torch_model, shape, what, check=False)
    else:
        step, _ = build(model, torch_model, shape, what, check=False, with_torch=False)
    for _ in range(warmup):
        step()
    times = [_seconds(step) for _ in range(steps)]
    print(json.dumps({"seconds": statistics.median(times), **runtime_info(side)}))


def _compare(key, threads, standin, rounds, steps, warmup):
    from benchmarks.alternating import alternate, child_environment, run_child
    env = child_environment(threads, standin)

    def side(name):
        return lambda: run_child(__spec__.name, ["--side", name, "--case", key, "--threads", str(threads),
                                          "--steps", str(steps), "--warmup", str(warmup)], env)

    side("check")()
    return alternate(side("ours"), side("torch"), rounds)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per process (their median counts)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--isa", default="native", help="comma-separated: native, avx2 (the AVX2 stand-in)")
    parser.add_argument("--only", default="", help="comma-separated substrings of case names")
    parser.add_argument("--side", choices=("ours", "torch", "check"), help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        limit_threads_before_imports(int(args.threads))
        _child(args.side, args.case, int(args.threads), args.steps, args.warmup)
        return 0
    from benchmarks.alternating import ms_summary, ratio_summary
    for standin in args.isa.split(","):
        print(f"\n### instruction set: {standin}\n")
        print("| case | threads | ours (ms) | PyTorch (ms) | ratio median [min-max] | target |")
        print("|---|---:|---:|---:|---:|---|")
        seen = {}
        for threads in (int(t) for t in args.threads.split(",")):
            for name, key, _, _, _, target in CASES:
                if args.only and not any(part in name for part in args.only.split(",")):
                    continue
                pairs = _compare(key, threads, standin, args.rounds, args.steps, args.warmup)
                ours, theirs = [o["seconds"] for o, _ in pairs], [t["seconds"] for _, t in pairs]
                ratios = sorted(o / t for o, t in zip(ours, theirs))
                verdict = "-" if target is None else f"<= {target} ({'met' if statistics.median(ratios) <= target else 'NOT met'})"
                print(f"| {name} | {threads} | {ms_summary(ours)} | {ms_summary(theirs)} | "
                      f"{ratio_summary(ours, theirs)} | {verdict} |", flush=True)
                seen = {"ours": {k: v for k, v in pairs[0][0].items() if k != "seconds"},
                        "PyTorch": {k: v for k, v in pairs[0][1].items() if k != "seconds"}}
        for who, info in seen.items():
            print(f"\n{who}: " + "; ".join(f"{k} {v}" for k, v in info.items()))
    print(f"\n{args.rounds} rounds, each side in its own process, order alternating; per process the median of "
          f"{args.steps} steps after {args.warmup} warm-up steps; {platform.machine()} {_cpu_model()}, "
          f"{os.cpu_count()} CPUs, load average {' '.join(f'{v:.1f}' for v in os.getloadavg())} (at the end)")
    return 0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


if __name__ == "__main__":
    raise SystemExit(main())
