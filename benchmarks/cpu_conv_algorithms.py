"""The convolution algorithms of `planner.conv_algorithm` against each other and PyTorch's, per resnet20 layer.

One process, one thread for numba, BLAS and PyTorch, the callables interleaved (each repetition times every
one once, in a rotated order), so that load on a shared machine hits all of them alike; each cell is the
median over repetitions of the ratio ours / PyTorch of the same repetition. "before" is the rule of the
commit before the direct backward kernels (direct forward for the stem and the strided layers of at most
32 channels, im2col + GEMM otherwise); "after" is the plan's rule on this machine. bwd: dx and dW; dW: alone.
Complements `cpu_conv_layers` (each side in its own process, the protocol for PyTorch at several threads).

    python -m benchmarks.cpu_conv_algorithms [--reps 11] [--batch 128]
"""
from __future__ import annotations

import argparse
import statistics
import time

#: resnet20's 3x3 convolutions: (Cin, Cout, stride, input size)
LAYERS = [(3, 16, 1, 32), (16, 16, 1, 32), (16, 32, 2, 32), (32, 32, 1, 16), (32, 64, 2, 16), (64, 64, 1, 8)]


def _before(w_shape, stride):
    from planner.conv_algorithm import ConvAlgorithms
    cout, k, _, cin = w_shape
    forward = "direct" if cout % 8 == 0 and cout <= 32 and (k * k * cin <= 32 or stride > 1) else "gemm"
    return ConvAlgorithms(forward, "gemm", "gemm")


def _callables(cin, cout, s, h, n, rng):
    import numpy as np
    import torch

    from cpu_ref import kernels as K
    from planner.conv_algorithm import conv_algorithms
    from planner.reference import conv_output_size
    k, p = 3, 1
    oh = conv_output_size(h, k, s, p)
    x = rng.standard_normal((n, h, h, cin)).astype(np.float32)
    w = rng.standard_normal((cout, k, k, cin)).astype(np.float32)
    dy = rng.standard_normal((n, oh, oh, cout)).astype(np.float32)
    dx, dw, y = np.empty_like(x), np.empty_like(w), np.empty_like(dy)
    col = np.empty(n * oh * oh * k * k * cin, np.float32)
    after, before = conv_algorithms(w.shape, s, p, 1, x.shape[:3]), _before(w.shape, s)

    def nchw(a):
        return torch.from_numpy(a.transpose(0, 3, 1, 2).copy()).contiguous(memory_format=torch.channels_last)
    tx, tw, tdy = nchw(x), nchw(w), nchw(dy)

    def torch_forward():
        with torch.no_grad():
            torch.nn.functional.conv2d(tx, tw, None, s, p)

    def torch_backward(mask=(True, True, False)):
        torch.ops.aten.convolution_backward(tdy, tx, tw, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, list(mask))

    fns = {"torch fwd": torch_forward, "torch bwd": torch_backward,
           "torch dW": lambda: torch_backward((False, True, False))}
    for label, algorithms in (("before", before), ("after", after)):
        fns[f"{label} fwd"] = lambda a=algorithms: K.conv2d_forward(x, w, y, s, p, 1, col, a)
        fns[f"{label} bwd"] = lambda a=algorithms: K.conv2d_backward(x, w, dy, dx, dw, s, p, 1, col, False, a)
        fns[f"{label} dW"] = lambda a=algorithms: K.conv2d_backward(x, w, dy, None, dw, s, p, 1, col, False, a)
    return after, fns


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=11)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args(argv)
    from benchmarks.cpu_vs_torch import limit_threads_before_imports
    limit_threads_before_imports(1)
    import numpy as np
    import torch
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print("| layer | algorithms after | fwd before | fwd after | bwd before | bwd after | dW before | dW after |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for cin, cout, s, h in LAYERS:
        after, fns = _callables(cin, cout, s, h, args.batch, rng)
        for fn in fns.values():
            fn()
        names, times = list(fns), {name: [] for name in fns}
        for rep in range(args.reps):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                start = time.perf_counter()
                fns[name]()
                times[name].append(time.perf_counter() - start)
        cells = [f"{statistics.median(a / b for a, b in zip(times[f'{side} {d}'], times[f'torch {d}'])):.2f}"
                 for d in ("fwd", "bwd", "dW") for side in ("before", "after")]
        print(f"| {cin}->{cout} 3x3/{s} at {h}x{h} | {after} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nours / PyTorch, 1 thread, batch {args.batch}; median over {args.reps} interleaved repetitions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
