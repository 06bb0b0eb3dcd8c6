"""Every distinct convolution of resnet20 and resnet18-CIFAR: ours against PyTorch's, layer by layer.

Ours: `cpu_ref.kernels.conv2d_forward` and `conv2d_backward` (dW and dx; and dW alone, without dx), NHWC.
PyTorch's: `torch.nn.functional.conv2d` and `aten::convolution_backward` (grad input and grad weight; grad
weight alone) on channels_last tensors. The input gradient's share is the difference of the two backward columns. The convolutions are read off the PyTorch models (a forward hook on every
Conv2d), each with the number of times it occurs. Each side runs in its own process, alternated
over `--rounds` (`alternating.py`); a process times every layer `--reps` times after a warm-up
and reports the median per layer; the table quotes the median over rounds of the ratios, with
their min-max.

    python -m benchmarks.cpu_conv_layers [--threads 1] [--rounds 5] [--nets resnet20,resnet18_cifar]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

#: Batch per network (resnet18-CIFAR's im2col workspace at batch 128 would be 300 MB).
BATCH = {"resnet20": 128, "resnet18_cifar": 32}


def distinct_convolutions(net_name: str) -> list[dict]:
    """``{cin, cout, k, stride, pad, h, w, count}`` of every distinct Conv2d of the PyTorch model, in first-use order."""
    import torch

    from tests.support import torch_models
    net = getattr(torch_models, net_name)()
    seen: dict[tuple, dict] = {}

    def hook(module, inputs, _output):
        _, cin, h, w = inputs[0].shape
        key = (cin, module.out_channels, module.kernel_size[0], module.stride[0], module.padding[0], h, w)
        entry = seen.setdefault(key, dict(zip(("cin", "cout", "k", "stride", "pad", "h", "w"), key), count=0))
        entry["count"] += 1

    for module in net.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.register_forward_hook(hook)
    with torch.no_grad():
        net.eval()(torch.zeros(1, 3, 32, 32))
    return list(seen.values())


def _label(conv: dict) -> str:
    return (f"{conv['cin']}->{conv['cout']} {conv['k']}x{conv['k']}/{conv['stride']} at {conv['h']}x{conv['w']}"
            f" (x{conv['count']})")


def _median_seconds(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _ours(conv: dict, n: int):
    import numpy as np

    from planner.reference import conv_output_size
    from cpu_ref.kernels import conv2d_backward, conv2d_forward
    k, s, p = conv["k"], conv["stride"], conv["pad"]
    oh, ow = conv_output_size(conv["h"], k, s, p), conv_output_size(conv["w"], k, s, p)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, conv["h"], conv["w"], conv["cin"])).astype(np.float32)
    w = rng.standard_normal((conv["cout"], k, k, conv["cin"])).astype(np.float32)
    y = np.empty((n, oh, ow, conv["cout"]), np.float32)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx, dw = np.empty_like(x), np.empty_like(w)
    col = np.empty(n * oh * ow * k * k * conv["cin"], np.float32)
    return (lambda: conv2d_forward(x, w, y, s, p, 1, col),
            lambda: conv2d_backward(x, w, dy, dx, dw, s, p, 1, col, False),
            lambda: conv2d_backward(x, w, dy, None, dw, s, p, 1, col, False))


def _torch(conv: dict, n: int):
    import torch
    k, s, p = conv["k"], conv["stride"], conv["pad"]
    cl = torch.channels_last
    x = torch.randn(n, conv["cin"], conv["h"], conv["w"]).to(memory_format=cl)
    w = torch.randn(conv["cout"], conv["cin"], k, k).to(memory_format=cl)
    y = torch.nn.functional.conv2d(x, w, None, s, p)
    dy = torch.randn_like(y).to(memory_format=cl)

    def forward():
        with torch.no_grad():
            torch.nn.functional.conv2d(x, w, None, s, p)

    def backward(mask=(True, True, False)):
        torch.ops.aten.convolution_backward(dy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, list(mask))
    return forward, backward, lambda: backward((False, True, False))


def _child(side: str, layers: dict[str, list], threads: int, reps: int) -> None:
    """Times ``{label: [net, conv]}`` (the parent read them off the models, so that our process never runs torch)."""
    if side == "torch":
        import torch
        torch.set_num_threads(threads)
    build = _ours if side == "ours" else _torch
    result = {}
    for label, (net, conv) in layers.items():
        result[label] = [_median_seconds(fn, reps) for fn in build(conv, BATCH[net])]
    print(json.dumps(result))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--isa", default="native", choices=("native", "avx2"))
    parser.add_argument("--nets", default="resnet20,resnet18_cifar")
    parser.add_argument("--side", choices=("ours", "torch"), help=argparse.SUPPRESS)
    parser.add_argument("--layers", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    nets = args.nets.split(",")
    if args.side:
        from benchmarks.cpu_vs_torch import limit_threads_before_imports
        limit_threads_before_imports(args.threads)
        _child(args.side, json.loads(args.layers), args.threads, args.reps)
        return 0
    layers = json.dumps({f"{net}: {_label(conv)}": [net, conv] for net in nets for conv in distinct_convolutions(net)})
    from benchmarks.alternating import (
        alternate,
        child_environment,
        ms_summary,
        ratio_summary,
        run_child,
    )
    env = child_environment(args.threads, args.isa)

    def side(name):
        return lambda: run_child(__spec__.name, ["--side", name, "--threads", str(args.threads), "--reps", str(args.reps),
                                          "--layers", layers], env)

    pairs = alternate(side("ours"), side("torch"), args.rounds)
    print(f"| convolution (count), batch {', '.join(f'{n} {BATCH[n]}' for n in nets)} | fwd ours (ms) | "
          "fwd PyTorch | fwd ratio | bwd ours (ms) | bwd PyTorch | bwd ratio | dW ours (ms) | dW PyTorch | dW ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layer in pairs[0][0]:
        cells = []
        for which in (0, 1, 2):
            ours = [o[layer][which] for o, _ in pairs]
            theirs = [t[layer][which] for _, t in pairs]
            cells += [ms_summary(ours), ms_summary(theirs), ratio_summary(ours, theirs)]
        print(f"| {layer} | " + " | ".join(cells) + " |", flush=True)
    print(f"\n{args.threads} thread(s), instruction set {args.isa}; {args.rounds} rounds, each side in its own process, "
          f"alternating; per process the median of {args.reps} runs per layer; cells: median [min-max] over rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
