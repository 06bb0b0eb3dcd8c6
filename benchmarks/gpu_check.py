"""GPU check of the CUDA path, on a real device (sized for an H200, under 8 minutes):

- kernel rows: every kernel cross-checked against the numpy spec, a kernel timing table, and
  graph-versus-eager replay of a hand-made tape;
- step-check: a whole training step at real shapes, ``CudaExecutor`` (fused AMP plan) against
  ``CpuExecutor`` (fp32) from the same weights: loss, gradients, updates, BN statistics;
- step-replay: CUDA graph replay equals eager tape replay over several steps (one graph launch
  per step);
- step-timing: images/s of one training step of resnet18-cifar, resnet50 and mobilenet_v2, ours
  (eager tape, graph replay) against PyTorch eager AMP channels_last and torch.compile, side by
  side, with our arena bytes against PyTorch's ``max_memory_allocated``.

    python benchmarks/gpu_check.py --dry-run    # CPU only (CI): no GPU, no simulator
    python benchmarks/gpu_check.py              # on the GPU; exit 0 only if every check ran and passed
    python benchmarks/gpu_check.py --only conv --json out.json
    python benchmarks/gpu_check.py --only step-timing --budget 300

``--dry-run`` builds every kernel row with numpy stand-ins for the device arrays and runs every
launcher against the kernel table's signatures (so argument lists, shapes and kernel names are
all checked); it compiles the plans of the step sections, records each training step with the
executor's own code against the kernel table, checks the PyTorch twins of the timed models
(parameter counts, names, shapes; their timed step run once on the CPU at a tiny size), prints
the plan and exits 0. ``--budget`` bounds the GPU run: units that no longer fit are reported as
NOT RUN (exit 1), torch.compile is tried last and only with time left.
"""
import argparse
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")   # small grids are deliberate in places
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from cpu_ref import reference as ref  # noqa: E402
from cuda_kernels import _batchnorm, _conv, _elementwise, _linear, _loss, _optim, _pool  # noqa: E402
from cuda_kernels._graph import StepRunner, graph_support, new_stream, synchronize  # noqa: E402
from cuda_kernels._registry import all_kernels, check_args  # noqa: E402
from cuda_kernels._tape import LaunchTape  # noqa: E402

TOLERANCES = {"fp16": (2e-3, 2e-3), "fp32": (1e-4, 1e-5), "stats": (1e-3, 1e-4), "exact": (0.0, 0.0)}
CHECK_BATCH, TIMING_BATCH = 8, 256
PARAMETERS = 11_200_000            # ResNet-18 sized optimizer region


# ---------------------------------------------------------------------------- memory

class HostStandIns:
    """``--dry-run``: numpy arrays stand for device arrays; nothing is computed."""
    dry = True

    def random(self, rng, shape, dtype, scale=1.0):
        a = np.empty(shape, dtype)
        return a, a

    def constant(self, value):
        return np.asarray(value)

    def output(self, shape, dtype):
        return np.empty(shape, dtype)


class DeviceMemory:
    dry = False

    def random(self, rng, shape, dtype, scale=1.0):
        if np.issubdtype(np.dtype(dtype), np.integer):
            host = rng.integers(0, scale, shape).astype(dtype)
        else:
            host = (rng.standard_normal(shape, np.float32) * scale).astype(dtype)
        return host, cuda.to_device(host)

    def constant(self, value):
        return cuda.to_device(np.asarray(value))

    def output(self, shape, dtype):
        fill = 7 if np.issubdtype(np.dtype(dtype), np.integer) else np.nan
        return cuda.to_device(np.full(shape, fill, dtype))


class DryLauncher:
    """Checks every launch against the kernel table (host stand-ins allowed) and counts them."""

    def __init__(self):
        self.names = []

    def launch(self, spec, grid, block, *args):
        check_args(spec, args, host_stand_ins=True)
        self.names.append(spec.name)


# ---------------------------------------------------------------------------- the table

@dataclass
class Case:
    """One timed unit: its launches, its outputs, the spec's answer, its work."""
    record: object                    # record(launcher)
    outputs: dict                     # label -> device array
    expected: object = None           # () -> {label: (array, tolerance)}; None: timing only
    flops: float = 0.0
    bytes: float = 0.0
    names: list = field(default_factory=list)


def f32(a):
    return np.asarray(a, np.float32)


def conv_case(mem, rng, batch, h, w, cin, cout, k, s, p, groups, direction, with_stats=True):
    (hx, x), (hw, wt) = mem.random(rng, (batch, h, w, cin), np.float16), mem.random(
        rng, (cout, k, k, cin // groups), np.float16, 1.0 / math.sqrt(k * k * cin / groups))
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    macs = batch * oh * ow * cout * k * k * cin / groups
    if direction == "fwd":
        y = mem.output((batch, oh, ow, cout), np.float16)
        sums = (mem.output(cout, np.float32), mem.output(cout, np.float32)) if with_stats else None
        expected = lambda: {"y": (ref.conv2d_forward(f32(hx), f32(hw), s, p, groups), "fp16")}  # noqa: E731
        return Case(lambda t: _conv.conv2d_forward(t, x, wt, y, s, p, groups, bn_sums=sums), {"y": y}, expected,
                    2 * macs, 2 * (x.size + wt.size + y.size))
    hdy, dy = mem.random(rng, (batch, oh, ow, cout), np.float16)
    dx, dw = mem.output((batch, h, w, cin), np.float16), mem.output(wt.shape, np.float32)

    def expected():
        rdx, rdw = ref.conv2d_backward(f32(hx), f32(hw), f32(hdy), s, p, groups)
        return {"dx": (rdx, "fp16"), "dw": (rdw, "fp32")}
    return Case(lambda t: _conv.conv2d_backward(t, x, wt, dy, dx, dw, s, p, groups, False), {"dx": dx, "dw": dw},
                expected, 4 * macs, 2 * (2 * x.size + dy.size) + 6 * wt.size)


def batchnorm_case(mem, rng, rows, channels, direction):
    (hx, x), (hg, gamma) = mem.random(rng, (rows, channels), np.float16), mem.random(rng, channels, np.float32)
    (hb, beta), y = mem.random(rng, channels, np.float32), mem.output((rows, channels), np.float16)
    mean, invstd = mem.output(channels, np.float32), mem.output(channels, np.float32)
    rm, rv = mem.constant(np.zeros(channels, np.float32)), mem.constant(np.ones(channels, np.float32))
    if direction == "fwd":
        def expected():
            ry, rmean, rinv, _, _ = ref.batchnorm_forward_train(f32(hx), hg, hb, np.zeros(channels), np.ones(channels),
                                                                0.1, 1e-5)
            return {"y": (np.maximum(ry, 0), "fp16"), "mean": (rmean, "stats"), "invstd": (rinv, "stats")}
        return Case(lambda t: _batchnorm.batchnorm_forward_train(t, x, gamma, beta, y, mean, invstd, rm, rv, 0.1,
                                                                 1e-5, activation="relu"),
                    {"y": y, "mean": mean, "invstd": invstd}, expected, 0, 3 * 2 * x.size)
    hmean, hinv = hx.astype(np.float32).mean(0), 1 / np.sqrt(hx.astype(np.float32).var(0) + 1e-5)
    hdy, dy = mem.random(rng, (rows, channels), np.float16)
    dx, dgamma, dbeta = mem.output((rows, channels), np.float16), mem.output(channels, np.float32), mem.output(
        channels, np.float32)
    smean, sinv = mem.constant(hmean.astype(np.float32)), mem.constant(hinv.astype(np.float32))

    def expected():
        rdx, rdg, rdb = ref.batchnorm_backward(f32(hx), hg, hmean, hinv, f32(hdy))
        return {"dx": (rdx, "fp16"), "dgamma": (rdg, "fp32"), "dbeta": (rdb, "fp32")}
    return Case(lambda t: _batchnorm.batchnorm_backward(t, x, gamma, smean, sinv, dy, dx, dgamma, dbeta, False),
                {"dx": dx, "dgamma": dgamma, "dbeta": dbeta}, expected, 0, 5 * 2 * x.size)


def activation_case(mem, rng, n, code):
    (hx, x), y = mem.random(rng, n, np.float16, 3.0), mem.output(n, np.float16)
    return Case(lambda t: _elementwise.activation_forward(t, code, x, y, 0.1), {"y": y},
                lambda: {"y": (ref.activation_forward(code, f32(hx), 0.1), "fp16")}, 0, 4 * n)


def dropout_case(mem, rng, n):
    (hx, x), y, mask = mem.random(rng, n, np.float16), mem.output(n, np.float16), mem.output(n, np.uint8)
    step = mem.constant(np.array([17], np.int32))

    def expected():
        ry, rmask = ref.dropout_forward(f32(hx), 0.1, 99, 17)
        return {"y": (ry, "fp16"), "mask": (rmask, "exact")}
    return Case(lambda t: _elementwise.dropout_forward(t, x, y, mask, 0.1, 99, step), {"y": y, "mask": mask},
                expected, 0, 5 * n)


def linear_case(mem, rng, batch, f_in, f_out, direction):
    (hx, x), (hw, w) = mem.random(rng, (batch, f_in), np.float16), mem.random(rng, (f_out, f_in), np.float16, 0.05)
    (hb, b), y = mem.random(rng, f_out, np.float32), mem.output((batch, f_out), np.float16)
    if direction == "fwd":
        return Case(lambda t: _linear.linear_forward(t, x, w, b, y), {"y": y},
                    lambda: {"y": (ref.linear_forward(f32(hx), f32(hw), hb), "fp16")}, 2 * batch * f_in * f_out,
                    2 * (x.size + w.size + y.size))
    hdy, dy = mem.random(rng, (batch, f_out), np.float16)
    dx, dw, db = mem.output((batch, f_in), np.float16), mem.output((f_out, f_in), np.float32), mem.output(
        f_out, np.float32)

    def expected():
        rdx, rdw, rdb = ref.linear_backward(f32(hx), f32(hw), f32(hdy))
        return {"dx": (rdx, "fp16"), "dw": (rdw, "fp32"), "db": (rdb, "fp32")}
    return Case(lambda t: _linear.linear_backward(t, x, w, dy, dx, dw, db, False), {"dx": dx, "dw": dw, "db": db},
                expected, 4 * batch * f_in * f_out, 2 * (2 * x.size + dy.size) + 8 * w.size)


def softmax_case(mem, rng, batch, classes):
    (hl, logits), (hy, labels) = mem.random(rng, (batch, classes), np.float16, 3.0), mem.random(
        rng, batch, np.int32, classes)
    loss, dl, scale = mem.output(1, np.float32), mem.output((batch, classes), np.float16), mem.constant(
        np.array([1024.0], np.float32))

    correct = mem.output(1, np.int32)

    def record(t):
        _loss.softmax_cross_entropy(t, logits, labels, 0.1, loss, dl, scale)
        _loss.count_correct(t, logits, labels, correct)

    def expected():
        rl, rdl = ref.softmax_cross_entropy(f32(hl), hy, 0.1, 1024.0)
        hits = np.array([np.count_nonzero(f32(hl).argmax(1) == hy)], np.int32)
        return {"loss": (np.array([rl], np.float32), "fp32"), "dlogits": (rdl, "fp16"), "correct": (hits, "exact")}
    return Case(record, {"loss": loss, "dlogits": dl, "correct": correct}, expected, 0, 4 * logits.size)


def maxpool_case(mem, rng, batch, h, c):
    (hx, x), oh = mem.random(rng, (batch, h, h, c), np.float16), (h + 2 - 3) // 2 + 1
    y, argmax = mem.output((batch, oh, oh, c), np.float16), mem.output((batch, oh, oh, c), np.int32)

    def expected():
        ry, ra = ref.maxpool_forward(f32(hx), 3, 2, 1)
        return {"y": (ry, "exact"), "argmax": (ra, "exact")}
    return Case(lambda t: _pool.maxpool_forward(t, x, y, argmax, 3, 2, 1), {"y": y, "argmax": argmax}, expected,
                0, 2 * x.size + 6 * y.size)


def gap_case(mem, rng, batch, h, c):
    (hx, x), y = mem.random(rng, (batch, h, h, c), np.float16), mem.output((batch, c), np.float16)
    return Case(lambda t: _pool.gap_forward(t, x, y), {"y": y}, lambda: {"y": (ref.gap_forward(f32(hx)), "fp16")},
                0, 2 * x.size)


def adam_case(mem, rng, n):
    (hp, p), (hg, g) = mem.random(rng, n, np.float32), mem.random(rng, n, np.float32)
    m, v = mem.constant(np.zeros(n, np.float32)), mem.constant(np.zeros(n, np.float32))
    lr, step, scale, flag = (mem.constant(np.array([a], t)) for a, t in
                             [(1e-3, np.float32), (0, np.int32), (1.0, np.float32), (0, np.int32)])

    def expected():
        rp, rm, rv = ref.adam_step(hp, hg, np.zeros(n, np.float32), np.zeros(n, np.float32), 1e-3, 0.9, 0.999, 1e-8,
                                   1e-2, 1, True)
        return {"p": (rp, "fp32"), "m": (rm, "fp32"), "v": (rv, "fp32")}
    return Case(lambda t: _optim.adam_step(t, p, g, m, v, lr, step, scale, flag, 0.9, 0.999, 1e-8, 1e-2, True),
                {"p": p, "m": m, "v": v}, expected, 0, 4 * 7 * n)


def overflow_and_cast_case(mem, rng, n):
    (hp, p), flag, p16 = mem.random(rng, n, np.float32), mem.output(1, np.int32), mem.output(n, np.float16)

    def record(t):
        _optim.check_overflow(t, p, flag)
        _elementwise.cast_f32_to_f16(t, p, p16)
    return Case(record, {"found_inf": flag, "p16": p16},
                lambda: {"found_inf": (np.zeros(1, np.int32), "exact"), "p16": (hp.astype(np.float16), "exact")},
                0, 4 * n + 6 * n)


def elementwise_case(mem, rng, n):
    """The small elementwise kernels in one row: activation backward, add, accumulate, channel
    pad, dropout backward, fp16 zeroing."""
    (hx, x), (hdy, dy) = mem.random(rng, (n, 16), np.float16, 3.0), mem.random(rng, (n, 16), np.float16)
    (hm, mask), dx = mem.random(rng, (n, 16), np.uint8, 2), mem.output((n, 16), np.float16)
    added, acc = mem.output((n, 16), np.float16), mem.constant(hdy)
    padded, unpadded = mem.output((n, 24), np.float16), mem.output((n, 16), np.float16)
    dropped, zeroed = mem.output((n, 16), np.float16), mem.constant(hdy)

    def record(t):
        _elementwise.activation_backward(t, _elementwise.HARDSWISH, x, dy, dx, 0.1, False)
        _elementwise.add_forward(t, x, dy, added)
        _elementwise.accumulate_into(t, acc, x, True)
        _elementwise.channel_pad_forward(t, x, padded)
        _elementwise.channel_pad_backward(t, padded, unpadded, False)
        _elementwise.dropout_backward(t, mask, dy, dropped, 0.2, False)
        _elementwise.fill_zero(t, zeroed)

    def expected():
        x64, dy64 = hx.astype(np.float64), hdy.astype(np.float64)
        return {"dx": (ref.activation_backward(_elementwise.HARDSWISH, x64, dy64, 0.1), "fp16"),
                "add": (x64 + dy64, "fp16"), "accumulate": (x64 + dy64, "fp16"),
                "pad": (ref.channel_pad_forward(hx, 24), "exact"), "unpad": (hx, "exact"),
                "dropout dx": (ref.dropout_backward(hm, dy64, 0.2), "fp16"), "zero": (np.zeros_like(hdy), "exact")}
    return Case(record, {"dx": dx, "add": added, "accumulate": acc, "pad": padded, "unpad": unpadded,
                         "dropout dx": dropped, "zero": zeroed}, expected, 0, 2 * 16 * n * 16)


def pool_backward_case(mem, rng, batch, h, c):
    """maxpool / avgpool forward+backward and the global-average-pool backward."""
    (hx, x), oh = mem.random(rng, (batch, h, h, c), np.float16), (h + 2 - 3) // 2 + 1
    (hdy, dy), (hgy, gdy) = mem.random(rng, (batch, oh, oh, c), np.float16), mem.random(rng, (batch, c), np.float16)
    y, argmax, avg = (mem.output((batch, oh, oh, c), t) for t in (np.float16, np.int32, np.float16))
    dx_max, dx_avg, dx_gap = (mem.output((batch, h, h, c), np.float16) for _ in range(3))

    def record(t):
        _pool.maxpool_forward(t, x, y, argmax, 3, 2, 1)
        _pool.maxpool_backward(t, argmax, dy, dx_max, 3, 2, 1, False)
        _pool.avgpool_forward(t, x, avg, 3, 2, 1)
        _pool.avgpool_backward(t, dy, dx_avg, 3, 2, 1, False)
        _pool.gap_backward(t, gdy, dx_gap, False)

    def expected():
        _, ra = ref.maxpool_forward(f32(hx), 3, 2, 1)
        return {"maxpool dx": (ref.maxpool_backward(ra, f32(hdy), hx.shape), "fp16"),
                "avgpool y": (ref.avgpool_forward(f32(hx), 3, 2, 1), "fp16"),
                "avgpool dx": (ref.avgpool_backward(f32(hdy), hx.shape, 3, 2, 1), "fp16"),
                "gap dx": (ref.gap_backward(f32(hgy), hx.shape), "fp16")}
    return Case(record, {"maxpool dx": dx_max, "avgpool y": avg, "avgpool dx": dx_avg, "gap dx": dx_gap}, expected,
                0, 2 * (4 * x.size + 6 * y.size))


def residual_bn_case(mem, rng, rows, channels):
    """Eval-mode BN + residual add + ReLU (the tail of a residual block), and SGD over a region."""
    (hx, x), (hr, res) = mem.random(rng, (rows, channels), np.float16), mem.random(rng, (rows, channels), np.float16)
    (hg, gamma), (hb, beta) = mem.random(rng, channels, np.float32), mem.random(rng, channels, np.float32)
    (hm, rm), y = mem.random(rng, channels, np.float32), mem.output((rows, channels), np.float16)
    rv = mem.constant(np.full(channels, 2.0, np.float32))
    (hp, p), (hgrad, g) = mem.random(rng, rows, np.float32), mem.random(rng, rows, np.float32)
    buf = mem.constant(np.zeros(rows, np.float32))
    lr, step, scale, flag = (mem.constant(np.array([a], t)) for a, t in
                             [(0.1, np.float32), (0, np.int32), (1.0, np.float32), (0, np.int32)])

    def record(t):
        _batchnorm.batchnorm_forward_eval(t, x, gamma, beta, rm, rv, 1e-5, y, activation="relu", residual=res)
        _optim.sgd_step(t, p, g, buf, lr, step, scale, flag, 0.9, 0.0, True, 1e-4)

    def expected():
        ry = ref.batchnorm_forward_eval(f32(hx), hg, hb, hm, np.full(channels, 2.0), 1e-5) + f32(hr)
        rp, rbuf = ref.sgd_step(hp, hgrad, np.zeros(rows), 0.1, 0.9, 0.0, True, 1e-4, True)
        return {"y": (np.maximum(ry, 0), "fp16"), "p": (rp, "fp32"), "buf": (rbuf, "fp32")}
    return Case(record, {"y": y, "p": p, "buf": buf}, expected, 0, 3 * 2 * x.size + 16 * rows)


CONV_SHAPES = {   # (H, W, Cin, Cout, k, stride, pad, groups): CIFAR ResNet, ImageNet bottleneck, MobileNet
    "conv3x3-64": (32, 32, 64, 64, 3, 1, 1, 1),
    "conv3x3-128-s2": (32, 32, 64, 128, 3, 2, 1, 1),
    "conv3x3-256": (8, 8, 256, 256, 3, 1, 1, 1),
    "conv1x1-256-1024": (14, 14, 256, 1024, 1, 1, 0, 1),
    "depthwise3x3-144": (28, 28, 144, 144, 3, 1, 1, 144),
}


def table(batch):
    """``name -> builder(mem, rng)`` for every row; ``batch`` scales the activations."""
    rows = {}
    for i, (name, shape) in enumerate(CONV_SHAPES.items()):   # every other forward with the BN-stats epilogue
        rows[f"{name} fwd" + (" +stats" if i % 2 == 0 else "")] = lambda mem, rng, s=shape, st=i % 2 == 0: conv_case(
            mem, rng, batch, *s, "fwd", st)
        rows[f"{name} bwd"] = lambda mem, rng, s=shape: conv_case(mem, rng, batch, *s, "bwd")
    for direction in ("fwd", "bwd"):
        rows[f"batchnorm 64ch {direction}"] = lambda mem, rng, d=direction: batchnorm_case(
            mem, rng, batch * 32 * 32, 64, d)
        rows[f"linear 512-1000 {direction}"] = lambda mem, rng, d=direction: linear_case(mem, rng, batch, 512, 1000, d)
    rows["gelu"] = lambda mem, rng: activation_case(mem, rng, batch * 32 * 32 * 64, _elementwise.GELU)
    rows["dropout"] = lambda mem, rng: dropout_case(mem, rng, batch * 4096)
    rows["maxpool 3-2-1"] = lambda mem, rng: maxpool_case(mem, rng, batch, 32, 64)
    rows["gap 8x8x512"] = lambda mem, rng: gap_case(mem, rng, batch, 8, 512)
    rows["softmax-ce 1000"] = lambda mem, rng: softmax_case(mem, rng, batch, 1000)
    rows["pool backward"] = lambda mem, rng: pool_backward_case(mem, rng, batch, 32, 64)
    rows["elementwise small"] = lambda mem, rng: elementwise_case(mem, rng, batch * 1024)
    rows["bn eval residual + sgd"] = lambda mem, rng: residual_bn_case(mem, rng, batch * 1024, 64)
    n_params = PARAMETERS if batch == TIMING_BATCH else 1 << 16
    rows["adamw region"] = lambda mem, rng: adam_case(mem, rng, n_params)
    rows["overflow+cast region"] = lambda mem, rng: overflow_and_cast_case(mem, rng, n_params)
    return rows


# ---------------------------------------------------------------------------- running

def time_tape(tape, stream, repeats=None, budget_s=0.2):
    """Mean seconds per eager replay of ``tape`` on ``stream`` (after one warm-up replay)."""
    return _time(lambda: tape.replay(stream), stream, repeats, budget_s)


def time_runner(runner, stream, repeats=None, budget_s=0.2):
    """Mean seconds per ``runner.run(stream)`` (the first run, which may capture, is not timed)."""
    return _time(lambda: runner.run(stream), stream, repeats, budget_s)


def _time(step, stream, repeats, budget_s):
    step()
    synchronize(stream)
    start, end = cuda.event(), cuda.event()
    if repeats is None:
        start.record(stream)
        step()
        end.record(stream)
        end.synchronize()
        repeats = int(min(200, max(3, budget_s / max(start.elapsed_time(end) / 1e3, 1e-6))))
    start.record(stream)
    for _ in range(repeats):
        step()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def compare(case):
    """``[(label, max_abs_error, ok)]`` of a case's outputs against the spec."""
    results = []
    for label, (expected, tol) in case.expected().items():
        got = case.outputs[label].copy_to_host()
        if tol == "exact":
            ok, err = bool(np.array_equal(got, expected)), float(np.abs(got.astype(np.float64) - expected).max())
        else:
            rtol, atol_frac = TOLERANCES[tol]
            atol = atol_frac * float(np.abs(expected).max(initial=0.0))
            diff = np.abs(got.astype(np.float64) - expected)
            ok, err = bool(np.all(diff <= atol + rtol * np.abs(expected))), float(diff.max())
        results.append((label, err, ok))
    return results


def cross_check(rows, stream):
    failures = []
    for name, build in rows.items():
        case = build(DeviceMemory(), np.random.default_rng(0))
        cuda.synchronize()   # inputs were copied on the default stream; ``stream`` does not wait for it
        tape = LaunchTape()
        case.record(tape)
        tape.replay(stream)
        synchronize(stream)
        results = compare(case)
        failures += [f"{name}: {label}" for label, _, ok in results if not ok]
        print(f"  {name:28s} " + "  ".join(f"{label} {err:.2e} {'ok' if ok else 'FAIL'}" for label, err, ok in results))
    return failures


def timing_table(rows, stream):
    report = []
    print(f"  {'row':28s} {'us':>10s} {'TFLOP/s':>8s} {'GB/s':>8s} launches")
    for name, build in rows.items():
        case = build(DeviceMemory(), np.random.default_rng(0))
        cuda.synchronize()
        tape = LaunchTape()
        case.record(tape)
        seconds = time_tape(tape, stream)
        tflops, gbs = case.flops / seconds / 1e12, case.bytes / seconds / 1e9
        print(f"  {name:28s} {seconds * 1e6:10.1f} {tflops:8.2f} {gbs:8.1f} {len(tape)}")
        report.append(dict(row=name, us=seconds * 1e6, tflops=tflops, gbs=gbs, launches=len(tape)))
        del case, tape
    return report


def graph_case(mem):
    """Many small launches driven by device scalars: what graph replay is for."""
    rng = np.random.default_rng(1)
    (_, x), y = mem.random(rng, 4096, np.float16), mem.output(4096, np.float16)
    (_, p), (_, g) = mem.random(rng, 4096, np.float32), mem.random(rng, 4096, np.float32)
    m, v, mask = mem.constant(np.zeros(4096, np.float32)), mem.constant(np.zeros(4096, np.float32)), mem.output(
        4096, np.uint8)
    lr, step, iteration, scale, flag, tracker = (mem.constant(np.array([a], t)) for a, t in [
        (1e-3, np.float32), (0, np.int32), (0, np.int32), (1.0, np.float32), (0, np.int32), (0, np.int32)])

    def record(t):
        for _ in range(50):
            _elementwise.dropout_forward(t, x, y, mask, 0.5, 5, iteration)
            _elementwise.activation_forward(t, _elementwise.SILU, y, y)
        _optim.check_overflow(t, g, flag)
        _optim.adam_step(t, p, g, m, v, lr, step, scale, flag, 0.9, 0.999, 1e-8, 0.0, True)
        _optim.update_loss_scale(t, flag, scale, tracker)
        _optim.advance_counters(t, flag, step, iteration)
    return record, {"y": y, "p": p, "mask": mask, "step": step, "iteration": iteration}


def graph_check(stream):
    """Graph replay equals eager replay step by step; returns (eager_us, graph_us, failures)."""
    record_e, eager = graph_case(DeviceMemory())
    record_g, graphed = graph_case(DeviceMemory())
    tape_e, tape_g = LaunchTape(), LaunchTape()
    record_e(tape_e)
    record_g(tape_g)
    cuda.synchronize()
    runner = StepRunner(tape_g, "graph")
    failures = []
    for i in range(3):
        tape_e.replay(stream)
        runner.run(stream)
        synchronize(stream)
        for label in eager:
            if not np.array_equal(eager[label].copy_to_host(), graphed[label].copy_to_host()):
                failures.append(f"graph replay {i}: {label} differs from eager")
    if graphed["step"].copy_to_host()[0] != 3:
        failures.append("graph replay did not advance the device step counter")
    return time_tape(tape_e, stream) * 1e6, time_runner(runner, stream) * 1e6, len(tape_g), failures


# ---------------------------------------------------------------------------- whole training steps

# The step-* sections run whole training steps of CompiledPlans on ``cuda_kernels.CudaExecutor``
# (fused AMP plans): against the fp32 CPU path (step-check), graph replay against eager replay
# (step-replay), and images/s against PyTorch (step-timing). ``--only`` picks a section by name
# ("step" picks all three) or models by name ("resnet50").
STEP_SECTIONS = ("step-check", "step-replay", "step-timing")
MOMENTUM, CHECK_LR, TIMING_LR = 0.9, 0.1, 0.01
LOSS_TOL, GRAD_TOL, NORM_FLOOR = 1e-2, 2e-2, 1e-2        # first step, fused AMP vs fp32
CHECK_SCALES = (2.0 ** 16, 2.0 ** 12, 2.0 ** 8)           # GradScaler's start first; lower ones if it overflows
REPLAY_STEPS, REPLAY_SCALE, REPLAY_LOSS_TOL, REPLAY_STATE_TOL = 5, 2.0 ** 12, 1e-5, 1e-4
TIMED_S, WARMUP_STEPS, MAX_TIMED_STEPS = 3.0, 2, 60       # per timed candidate
COMPILE_RESERVE_S = 100       # torch.compile is only tried with this much of the budget left
SECTION_RESERVE_S = 20        # a step section (or model) is only started with this much left
DEFAULT_BUDGET_S = 470        # the whole run: the issue asks for under 8 minutes on an H200
MIB = 2.0 ** 20


@dataclass(frozen=True)
class StepModel:
    """A network of the step-* sections: how to build it, its batch, and its PyTorch twin."""
    name: str
    blueprint: object             # () -> BluePrint
    batch: int
    hw: int
    about: str
    classes: int = 10
    torch_model: str = ""         # benchmarks/torch_models.py: <torch_model>(classes), same parameter names
    optional: bool = False        # timed after the required models, only if the budget allows

    @property
    def shape(self):
        return (self.batch, self.hw, self.hw, 3)

    @property
    def label(self):
        return f"{self.name} b{self.batch} {self.hw}x{self.hw}x3"

    def make_torch(self):
        return getattr(torch_models(), self.torch_model)(self.classes)


def torch_models():
    """benchmarks/torch_models.py (hand-written torchvision twins), however this script was started."""
    try:
        import torch_models as module
    except ImportError:
        from benchmarks import torch_models as module
    return module


def zoo_model(name, *args):
    def make():
        from blueprint import zoo
        return getattr(zoo, name)(*args)
    make.__name__ = f"zoo.{name}"
    return make


def resnet18_cifar_blueprint(num_classes=10):
    """ResNet-18 as usually trained on CIFAR: torchvision's ResNet-18 with a 3x3 stride-1 stem and no
    maxpool (stages at 32, 16, 8, 4 pixels); the twin of ``torch_models.resnet18_cifar``."""
    from blueprint import BlockStyle, BluePrint, block, bn, conv, fc, gap, named, relu, repeat, seq
    stages = [named(f"layer{i + 1}", seq(block(width, BlockStyle.RESNET_3_3_DS if i else BlockStyle.RESNET_3_3),
                                         repeat(block(width, BlockStyle.RESNET_3_3), 1)))
              for i, width in enumerate((64, 128, 256, 512))]
    root = seq(named("conv1", conv(64, 3, 1, 1)), named("bn1", bn()), relu(), *stages, gap(),
               named("fc", fc(num_classes)))
    return BluePrint(root, "resnet18_cifar")


def without_dropout(make):
    """The blueprint of ``make`` with every dropout replaced by an identity (same parameter names).
    The CPU path and a fused CUDA plan draw different dropout masks (the seed mixes in the layer's
    index in its own plan), so the fp32 cross-check cannot run dropout; graph-vs-eager replay (one
    plan) does. (Not dropout(0.0): the CUDA path's p = 0 training forward copies without writing
    the mask its backward reads.)"""
    def build():
        from blueprint import BluePrint, Kind, identity
        from blueprint._layer import map_layers
        bp = make()
        return BluePrint(map_layers(bp.root, lambda layer: identity() if layer.kind == Kind.DROPOUT else layer),
                         bp.name + "_nodropout")
    return build


CHECK_MODELS = (
    StepModel("resnet20", zoo_model("resnet20", 10), 32, 32,
              "He et al. CIFAR ResNet-20: CBR, BasicBlock identity + projection, GapFc"),
    StepModel("resnet50@128", zoo_model("resnet50", 10), 16, 128,
              "torchvision ResNet-50 at 128x128, 10 classes: 7x7 CBR, maxpool, Bottleneck identity + projection"),
    StepModel("mobilenet_v2@128-nodrop", without_dropout(zoo_model("mobilenet_v2", 10)), 16, 128,
              "torchvision MobileNetV2 at 128x128, 10 classes, no dropout: InvResidual (t=1, t=6, identity)"),
)
REPLAY_MODELS = (
    StepModel("resnet20", zoo_model("resnet20", 10), 32, 32, "He et al. CIFAR ResNet-20"),
    StepModel("mobilenet_v2@64", zoo_model("mobilenet_v2", 10), 16, 64,
              "torchvision MobileNetV2 at 64x64, dropout 0.2 (masks follow the device's step counter)"),
)
TIMING_MODELS = (
    StepModel("resnet18-cifar", resnet18_cifar_blueprint, 256, 32,
              "ResNet-18, CIFAR stem (3x3/1 conv, no maxpool), 10 classes", 10, "resnet18_cifar"),
    StepModel("resnet50", zoo_model("resnet50", 1000), 64, 224, "torchvision ResNet-50, 1000 classes", 1000,
              "resnet50"),
    StepModel("mobilenet_v2", zoo_model("mobilenet_v2", 1000), 64, 224,
              "torchvision MobileNetV2 (dropout 0.2), 1000 classes", 1000, "mobilenet_v2"),
    StepModel("resnet18-tv32", zoo_model("resnet18", 10), 256, 32,
              "torchvision ResNet-18 (7x7/2 stem + maxpool) at 32x32, 10 classes", 10, "resnet18", optional=True),
)
SECTION_MODELS = {"step-check": CHECK_MODELS, "step-replay": REPLAY_MODELS, "step-timing": TIMING_MODELS}
SECTION_TITLES = {
    "step-check": "whole training step at real shapes: CudaExecutor (fused AMP) vs CpuExecutor (fp32), same weights",
    "step-replay": f"graph replay vs eager replay over {REPLAY_STEPS} training steps, same weights and batches",
    "step-timing": "training-step images/s: ours (eager tape, CUDA graph) vs PyTorch eager AMP and torch.compile",
}


def step_selection(only):
    """``{section: [models]}`` that ``--only`` selects: a section by (part of) its name, or models
    by (part of) theirs; everything without ``--only``."""
    selected = {}
    for section, models in SECTION_MODELS.items():
        chosen = list(models) if not only or only in section else [m for m in models if only in m.name]
        if chosen:
            selected[section] = chosen
    return selected


def compile_step_plan(model, fuse=True, amp=True):
    from planner import ArchPlan
    from planner.compiler import Compiler
    arch = ArchPlan.from_blueprint(model.blueprint(), in_channels=3, fuse=fuse, amp=amp)
    return Compiler(arch).compile({"train": model.shape, "eval": model.shape}, optimizer_state_slots=1)


def step_batches(model, count, seed=0):
    """``count`` (x float32 NHWC, labels int64) batches of ``model``'s shape."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(model.shape, np.float32), rng.integers(0, model.classes, model.batch))
            for _ in range(count)]


def sgd():
    from blueprint.optim import SGD
    return SGD().momentum(MOMENTUM)


def relative_errors(got, want, floor=NORM_FLOOR):
    """``{name: |got - want|_2 / max(|want|_2, floor * largest |want|_2)}`` for every tensor of
    ``want`` (``got`` must have the same names); inf for a shape mismatch or a non-finite value."""
    if sorted(got) != sorted(want):
        raise KeyError(f"tensor names differ: only got {sorted(set(got) - set(want))[:5]}, "
                       f"only expected {sorted(set(want) - set(got))[:5]}")
    norms = {k: float(np.linalg.norm(np.asarray(v, np.float64))) for k, v in want.items()}
    least = floor * max(norms.values(), default=0.0)
    errors = {}
    for k, expected in want.items():
        g, w = np.asarray(got[k], np.float64), np.asarray(expected, np.float64)
        if g.shape != w.shape or not np.all(np.isfinite(g)):
            errors[k] = math.inf
            continue
        error, scale = float(np.linalg.norm(g - w)), max(norms[k], least)
        errors[k] = error / scale if scale > 0 else (0.0 if error == 0 else math.inf)
    return errors


def relative(a, b):
    a, b = float(a), float(b)
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(b), 1e-12)


def worst(errors):
    """``(worst error, its name, median)`` of a ``relative_errors`` dict."""
    if not errors:
        return 0.0, "-", 0.0
    name = max(errors, key=lambda k: errors[k])
    return errors[name], name, float(np.median(list(errors.values())))


def train_runner(ex):
    """The ``StepRunner`` of ``ex``'s training step (recorded by its first ``train_step``)."""
    runners = [runner for (_, purpose), runner in ex._runners.items() if purpose == "train"]
    if len(runners) != 1:
        raise RuntimeError(f"expected one recorded training step in CudaExecutor._runners, found {len(runners)} "
                           f"({sorted(ex._runners)}); has the executor's bookkeeping changed?")
    return runners[0]


def release_device_memory():
    """Free what deleted executors held (numba defers deallocations) and PyTorch's cached blocks."""
    import gc
    gc.collect()
    try:
        cuda.current_context().deallocations.clear()
    except Exception as error:   # not fatal: only the memory stays held longer
        if not getattr(release_device_memory, "warned", False):
            print(f"    (could not flush numba's deferred deallocations: {error}; memory is freed later)")
            release_device_memory.warned = True
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class Budget:
    """The run's time budget (``--budget`` seconds from the start)."""

    def __init__(self, seconds, started=None):
        self.seconds = seconds
        self.deadline = (started or time.time()) + seconds

    def left(self):
        return self.deadline - time.time()

    def allows(self, seconds, what, skipped):
        """True if ``seconds`` are left; otherwise say so and add ``what`` to ``skipped``."""
        if self.left() >= seconds:
            return True
        message = f"{what}: NOT RUN, {max(self.left(), 0):.0f} s of the {self.seconds:.0f} s budget left " \
                  f"(needs ~{seconds:.0f} s; raise --budget)"
        print(f"  {message}")
        skipped.append(message)
        return False


def report_crash(what, error, problems):
    """Print the traceback of a failed unit and record it; the run goes on with the next unit."""
    import traceback
    print(f"  {what}: CRASHED: {type(error).__name__}: {error}")
    traceback.print_exc(file=sys.stdout)
    problems.append(f"{what}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")


# ---- step-check: fused AMP on the GPU vs fp32 on the CPU, from the same weights

def step_check(models, budget, failures, skipped):
    """First training step of each model: CudaExecutor (fused AMP plan) against CpuExecutor (fp32
    unfused plan) from the same weights and batch. Loss within LOSS_TOL relative; gradients,
    parameter updates and BN running statistics within GRAD_TOL (per tensor, 2-norm of the
    difference relative to the tensor's norm, floored at NORM_FLOOR of the largest norm)."""
    from cpu_ref import CpuExecutor
    from cuda_kernels import CudaExecutor
    results = []
    print(f"  tolerances: loss {LOSS_TOL:g} relative; per tensor |diff|_2 <= {GRAD_TOL:g} x max(|ref|_2, "
          f"{NORM_FLOOR:g} x largest |ref|_2); SGD momentum {MOMENTUM}, lr {CHECK_LR}")
    for model in models:
        if not budget.allows(SECTION_RESERVE_S, f"step-check {model.name}", skipped):
            continue
        started = time.time()
        try:
            results.append(_step_check_one(model, CpuExecutor, CudaExecutor, failures))
        except Exception as error:
            report_crash(f"step-check {model.name}", error, failures)
        release_device_memory()
        print(f"    ({time.time() - started:.1f} s)")
    return results


def _step_check_one(model, CpuExecutor, CudaExecutor, failures):
    print(f"  {model.label}: {model.about}")
    plan, reference_plan = compile_step_plan(model), compile_step_plan(model, fuse=False, amp=False)
    (x, y), = step_batches(model, 1)
    cpu = CpuExecutor(reference_plan, optimizer=sgd(), seed=0)
    start = cpu.state_dict()
    want_loss = cpu.train_step(x, y, CHECK_LR)
    want_grads, want_state = cpu.gradients(), cpu.state_dict()
    ex = None
    for scale in CHECK_SCALES:
        ex = CudaExecutor(plan, optimizer=sgd(), seed=0, replay="eager", init_loss_scale=scale)
        ex.load_state_dict(start)
        loss = ex.train_step(x, y, CHECK_LR)
        if not ex.skipped_last_step:
            break
        print(f"    loss scale 2^{math.log2(scale):.0f}: the scaled fp16 gradients overflowed and the step was "
              f"skipped (as GradScaler would); trying a lower start")
        ex = None
        release_device_memory()
    if ex is None:
        failures.append(f"step-check {model.name}: the first step overflowed at every loss scale {CHECK_SCALES}")
        return dict(model=model.name, ok=False, overflowed=True)
    grads, state = ex.gradients(), ex.state_dict()
    launches = len(train_runner(ex).tape)
    trainable = {p.name for p in plan.params if p.region == "params"}
    counters = {k for k in want_state if k.endswith("num_batches_tracked")}
    stats = set(want_state) - trainable - counters

    def updates(sd):
        return {k: np.asarray(sd[k], np.float64) - start[k] for k in trainable}
    checks = {"gradients": relative_errors(grads, want_grads), "updates": relative_errors(updates(state),
                                                                                           updates(want_state)),
              "BN stats": relative_errors({k: state[k] for k in stats}, {k: want_state[k] for k in stats})}
    loss_error = relative(loss, want_loss)
    ok_loss = loss_error <= LOSS_TOL
    print(f"    loss scale 2^{math.log2(scale):.0f}, {launches} kernel launches per step")
    print(f"    {'loss':10s} {loss:.6f} vs fp32 {want_loss:.6f}: relative {loss_error:.2e} (tol {LOSS_TOL:g})  "
          f"{'ok' if ok_loss else 'FAIL'}")
    result = dict(model=model.name, loss=loss, fp32_loss=want_loss, loss_error=loss_error, scale=scale,
                  launches=launches)
    ok = ok_loss
    if not ok_loss:
        failures.append(f"step-check {model.name}: loss {loss:.6f} vs fp32 {want_loss:.6f}")
    for label, errors in checks.items():
        top, name, median = worst(errors)
        good = top <= GRAD_TOL
        bad = sorted((k for k in errors if errors[k] > GRAD_TOL), key=lambda k: -errors[k])
        verdict = "ok" if good else "FAIL: " + ", ".join(bad[:4]) + (" ..." if len(bad) > 4 else "")
        print(f"    {label:10s} {len(errors):4d} tensors: worst {top:.2e} ({name}), median {median:.2e} "
              f"(tol {GRAD_TOL:g})  {verdict}")
        if not good:
            failures.append(f"step-check {model.name}: {label} off for {len(bad)} tensors, worst {name} {top:.2e}")
        ok = ok and good
        result[label] = dict(worst=top, worst_name=name, median=median, failing=bad)
    wrong = sorted(k for k in counters if not np.array_equal(state[k], want_state[k]))
    print(f"    {'counters':10s} {len(counters):4d} num_batches_tracked  "
          f"{'ok' if not wrong else 'FAIL: ' + str(wrong[:3])}")
    if wrong:
        failures.append(f"step-check {model.name}: num_batches_tracked differs for {wrong[:3]}")
    result["ok"] = ok and not wrong
    return result


# ---- step-replay: one captured graph per step equals the eager tape

def step_replay(models, budget, failures, skipped):
    """Three executors from the same weights (graph replay, eager, eager again) take REPLAY_STEPS
    steps on the same batches. Graph vs eager: losses within REPLAY_LOSS_TOL relative (bitwise
    equal but for the order of fp32 atomics), state_dicts within REPLAY_STATE_TOL; eager vs eager
    shows how much of the difference the atomics alone make."""
    from cuda_kernels import CudaExecutor
    results = []
    for model in models:
        if not budget.allows(SECTION_RESERVE_S, f"step-replay {model.name}", skipped):
            continue
        started = time.time()
        try:
            results.append(_step_replay_one(model, CudaExecutor, failures))
        except Exception as error:
            report_crash(f"step-replay {model.name}", error, failures)
        release_device_memory()
        print(f"    ({time.time() - started:.1f} s)")
    return results


def _step_replay_one(model, CudaExecutor, failures):
    print(f"  {model.label}: {model.about}; {REPLAY_STEPS} steps, loss scale starts at 2^{math.log2(REPLAY_SCALE):.0f}")
    plan = compile_step_plan(model)
    modes = {"graph": "graph", "eager": "eager", "eager again": "eager"}
    executors = {label: CudaExecutor(plan, optimizer=sgd(), seed=0, replay=mode, init_loss_scale=REPLAY_SCALE)
                 for label, mode in modes.items()}
    start = executors["graph"].state_dict()
    for label in ("eager", "eager again"):
        executors[label].load_state_dict(start)
    losses, skipped, graphs = {k: [] for k in executors}, {k: 0 for k in executors}, []
    for x, y in step_batches(model, REPLAY_STEPS, seed=1):
        for label, ex in executors.items():
            losses[label].append(ex.train_step(x, y, CHECK_LR))
            skipped[label] += ex.skipped_last_step
        graphs.append(train_runner(executors["graph"]).graph)
    runner, eager_runner = train_runner(executors["graph"]), train_runner(executors["eager"])
    captured = runner.mode == "graph" and runner.graph is not None and all(g is runner.graph for g in graphs)
    states = {k: ex.state_dict() for k, ex in executors.items()}
    loss_diff = max(relative(a, b) for a, b in zip(losses["graph"], losses["eager"]))
    noise_diff = max(relative(a, b) for a, b in zip(losses["eager again"], losses["eager"]))
    state_diff, state_name, _ = worst(relative_errors(states["graph"], states["eager"]))
    noise_state, _, _ = worst(relative_errors(states["eager again"], states["eager"]))
    identical = losses["graph"] == losses["eager"] and all(np.array_equal(states["graph"][k], states["eager"][k])
                                                           for k in states["eager"])
    print(f"    graph captured: {'yes' if captured else 'NO'} (runner.mode {runner.mode!r}"
          f"{', reason: ' + runner.reason if runner.reason else ''}); launches per step: "
          f"graph {'1 graph launch' if captured else 'NOT one'} ({len(runner.tape)} kernels inside), "
          f"eager {len(eager_runner.tape)} kernel launches")
    print(f"    losses  graph: {' '.join(f'{v:.6f}' for v in losses['graph'])}")
    print(f"            eager: {' '.join(f'{v:.6f}' for v in losses['eager'])}")
    print(f"    skipped steps (overflow): graph {skipped['graph']}, eager {skipped['eager']}, "
          f"eager again {skipped['eager again']}")
    ok_loss, ok_state = loss_diff <= REPLAY_LOSS_TOL, state_diff <= REPLAY_STATE_TOL
    ok_skips = skipped["graph"] == skipped["eager"]
    print(f"    graph vs eager: {'bit-identical' if identical else 'not bit-identical'}; losses max relative "
          f"{loss_diff:.1e} (tol {REPLAY_LOSS_TOL:g}) {'ok' if ok_loss else 'FAIL'}; state_dict worst {state_diff:.1e} "
          f"({state_name}; tol {REPLAY_STATE_TOL:g}) {'ok' if ok_state else 'FAIL'}")
    print(f"    eager vs eager again (fp32 atomics alone): losses {noise_diff:.1e}, state_dict worst {noise_state:.1e}")
    if not captured:
        failures.append(f"step-replay {model.name}: graph mode did not capture one graph reused every step "
                        f"(mode {runner.mode!r} {runner.reason})")
    if not ok_loss:
        failures.append(f"step-replay {model.name}: graph vs eager losses differ by {loss_diff:.1e} relative "
                        f"(eager vs eager: {noise_diff:.1e})")
    if not ok_state:
        failures.append(f"step-replay {model.name}: graph vs eager state_dict {state_name} differs by "
                        f"{state_diff:.1e} (eager vs eager: {noise_state:.1e})")
    if not ok_skips:
        failures.append(f"step-replay {model.name}: skipped steps differ: graph {skipped['graph']}, "
                        f"eager {skipped['eager']}")
    return dict(model=model.name, captured=captured, launches_eager=len(eager_runner.tape), identical=identical,
                loss_diff=loss_diff, state_diff=state_diff, noise_loss_diff=noise_diff, noise_state_diff=noise_state,
                losses_graph=losses["graph"], losses_eager=losses["eager"], skipped=skipped,
                ok=captured and ok_loss and ok_state and ok_skips)


# ---- step-timing: images/s of one training step, ours vs PyTorch

TIMING_ROWS = (   # key, what the row measures
    ("ours eager", "ours: eager tape replay"),
    ("ours graph", "ours: CUDA graph replay"),
    ("ours train_step", "ours: graph, via train_step() *"),
    ("torch eager", "PyTorch eager AMP channels_last"),
    ("torch.compile", "torch.compile AMP channels_last"),
)


def time_steps(step, sync, budget_s=TIMED_S, warmup=WARMUP_STEPS):
    """``(median seconds per step, steps timed)``: ``warmup`` untimed steps, then up to three rounds
    of back-to-back steps, each timed from a synchronised device to ``sync()`` after its last step
    (the device's work is inside the timed region)."""
    for _ in range(warmup):
        step()
    sync()
    t = time.perf_counter()
    step()
    sync()
    one = max(time.perf_counter() - t, 1e-6)
    total = int(min(MAX_TIMED_STEPS, max(3, budget_s / one)))
    rounds = 3 if total >= 9 else 1
    per_round = total // rounds
    seconds = []
    for _ in range(rounds):
        sync()
        t = time.perf_counter()
        for _ in range(per_round):
            step()
        sync()
        seconds.append((time.perf_counter() - t) / per_round)
    return float(np.median(seconds)), per_round * rounds


def time_ours(model, plan, x, y, mode):
    """Our training step on ``mode`` ("eager" / "graph") replay. The timed step is the recorded one
    replayed with the batch already in its arena slot (as PyTorch's timed step has its batch on the
    device); in graph mode also ``train_step()`` as a user calls it."""
    from cuda_kernels import CudaExecutor
    ex = CudaExecutor(plan, optimizer=sgd(), seed=0, replay=mode)
    t = time.perf_counter()
    ex.train_step(x, y, TIMING_LR)              # records the tape (and, in graph mode, captures after it)
    first_s = time.perf_counter() - t
    runner = train_runner(ex)
    if mode == "graph" and runner.graph is None:
        raise RuntimeError(f"graph replay was asked for but no graph was captured after the first step "
                           f"(runner.mode {runner.mode!r}, {runner.reason or 'no reason given'})")
    seconds, steps = time_steps(lambda: runner.run(ex.stream), lambda: synchronize(ex.stream))
    result = dict(seconds=seconds, steps=steps, launches=len(runner.tape), graph=runner.graph is not None,
                  first_step_s=first_s)
    api = None
    if mode == "graph":
        api_s, api_steps = time_steps(lambda: ex.train_step(x, y, TIMING_LR), lambda: synchronize(ex.stream),
                                      TIMED_S / 2, warmup=1)
        api = dict(seconds=api_s, steps=api_steps, launches=len(runner.tape), graph=True)
    result.update(final_loss=ex.train_step(x, y, TIMING_LR), loss_scale=ex.loss_scale)
    return result, api    # the executor goes with this frame; the caller releases its memory


def torch_cuda():
    """``torch`` if PyTorch can run on this GPU, else ``RuntimeError`` saying why not."""
    try:
        import torch
    except Exception as error:
        raise RuntimeError(f"PyTorch is not importable ({type(error).__name__}: {error}); install a CUDA build of "
                           f"torch") from error
    if not torch.cuda.is_available():
        raise RuntimeError(f"PyTorch {torch.__version__} sees no CUDA device (torch.version.cuda = "
                           f"{torch.version.cuda}; a CPU-only build?); install a CUDA build of the same version")
    return torch


def torch_inputs(model, device):
    """A fixed batch on ``device``: images NCHW in channels_last memory, int64 labels."""
    import torch
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(model.batch, 3, model.hw, model.hw, generator=generator)
    y = torch.randint(0, model.classes, (model.batch,), generator=generator)
    return x.to(device).contiguous(memory_format=torch.channels_last), y.to(device)


def make_torch_step(net, x, y, device, amp):
    """PyTorch's training step, as a user writes it: autocast fp16 forward and loss, GradScaler,
    SGD with momentum (foreach on CUDA). Returns ``step() -> loss`` (asynchronous but for the
    GradScaler's one inf check per step)."""
    import torch
    import torch.nn.functional as F
    optimizer = torch.optim.SGD(net.parameters(), lr=TIMING_LR, momentum=MOMENTUM)
    scaler = torch.amp.GradScaler(device, enabled=amp)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.float16, enabled=amp):
            loss = F.cross_entropy(net(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss
    return step


def time_torch(model, compiled):
    """PyTorch's step on the GPU (eager, or ``torch.compile`` of the model in its default mode):
    timing, and ``max_memory_allocated`` of one steady-state step."""
    torch = torch_cuda()
    torch.backends.cudnn.benchmark = True     # fixed shapes: let cuDNN pick its fastest kernels (warm-up steps)
    net = model.make_torch().to(device="cuda", memory_format=torch.channels_last).train()
    if compiled:
        net = torch.compile(net)
    x, y = torch_inputs(model, "cuda")
    step = make_torch_step(net, x, y, "cuda", amp=True)
    t = time.perf_counter()
    step()                               # torch.compile compiles forward and backward here
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    seconds, steps = time_steps(step, torch.cuda.synchronize)
    loss = float(step().detach())
    return dict(seconds=seconds, steps=steps, peak_bytes=peak, first_step_s=first_s, final_loss=loss)


def time_torch_released(model, compiled):
    """``time_torch``, then its model, optimizer and (compiled) graphs freed."""
    try:
        return time_torch(model, compiled)
    finally:
        if compiled and "torch" in sys.modules:
            sys.modules["torch"]._dynamo.reset()
        release_device_memory()


def step_timing(models, budget, failures, skipped, notes):
    """The timing table: per model our eager and graph replays and PyTorch eager AMP, then (with
    the budget left) torch.compile, all in this process on this GPU."""
    rows = {}
    torch_why = ""
    try:
        torch = torch_cuda()
        print(f"  PyTorch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}) "
              f"on {torch.cuda.get_device_name()}")
    except RuntimeError as error:
        torch_why = str(error)
        print(f"  PyTorch columns NOT RUN: {torch_why}")
        skipped.append(f"step-timing PyTorch: {torch_why}")
    ordered = [m for m in models if not m.optional] + [m for m in models if m.optional]
    for model in ordered:
        need = 2 * SECTION_RESERVE_S if not model.optional else COMPILE_RESERVE_S
        if not budget.allows(need, f"step-timing {model.name}", skipped if not model.optional else notes):
            continue
        started = time.time()
        print(f"  {model.label}: {model.about}")
        row = rows[model.name] = {"model": model}
        try:
            plan = compile_step_plan(model)
            row["arena_bytes"] = plan.memory.arena_bytes
            (x, y), = step_batches(model, 1)
        except Exception as error:
            report_crash(f"step-timing {model.name}: plan", error, failures)
            plan = None
            for key in ("ours eager", "ours graph", "ours train_step"):
                row[key] = dict(error=f"no plan: {type(error).__name__}: {error}")
        for mode in ("eager", "graph") if plan is not None else ():
            try:
                result, api = time_ours(model, plan, x, y, mode)
                release_device_memory()
                row[f"ours {mode}"] = result
                if api is not None:
                    row["ours train_step"] = api
                print(f"    ours {mode:5s}: {result['seconds'] * 1e3:8.2f} ms/step ({result['steps']} timed), first "
                      f"step {result['first_step_s']:.1f} s, loss scale now {result['loss_scale']:g}")
            except Exception as error:
                row[f"ours {mode}"] = dict(error=f"{type(error).__name__}: {error}")
                if mode == "graph":
                    row["ours train_step"] = dict(error="not measured: graph replay failed")
                report_crash(f"step-timing {model.name} ours {mode}", error, failures)
                release_device_memory()
        if torch_why:
            row["torch eager"] = dict(error=torch_why)
        else:
            try:
                row["torch eager"] = result = time_torch_released(model, compiled=False)
                print(f"    torch eager: {result['seconds'] * 1e3:8.2f} ms/step ({result['steps']} timed), "
                      f"peak {result['peak_bytes'] / MIB:.0f} MiB")
            except Exception as error:
                row["torch eager"] = dict(error=f"{type(error).__name__}: {error}")
                report_crash(f"step-timing {model.name} torch eager", error, skipped)
                release_device_memory()
        print(f"    ({time.time() - started:.1f} s)")
    for model in ordered:      # torch.compile last: it may take minutes, and it only adds a column
        if model.name not in rows:
            continue
        row = rows[model.name]
        if torch_why:
            row["torch.compile"] = dict(error=torch_why)
            continue
        if budget.left() < COMPILE_RESERVE_S:
            why = f"not tried: {max(budget.left(), 0):.0f} s of the budget left, a compile needs ~{COMPILE_RESERVE_S} s"
            print(f"  torch.compile {model.name}: {why}")
            row["torch.compile"] = dict(error=why)
            notes.append(f"torch.compile {model.name}: {why}")
            continue
        try:
            row["torch.compile"] = result = time_torch_released(model, compiled=True)
            print(f"  torch.compile {model.name}: {result['seconds'] * 1e3:8.2f} ms/step, compiled in "
                  f"{result['first_step_s']:.0f} s, peak {result['peak_bytes'] / MIB:.0f} MiB")
        except Exception as error:
            why = f"failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
            print(f"  torch.compile {model.name}: {why}")
            row["torch.compile"] = dict(error=why)
            notes.append(f"torch.compile {model.name}: {why}")
            release_device_memory()
    print()
    print(format_timing_table(rows))
    return rows


def _images_per_s(model, result):
    if not result or "seconds" not in result:
        return None
    return model.batch / result["seconds"]


def format_timing_table(rows, dry=False):
    """The side-by-side table (text). ``rows``: model name -> {"model", "arena_bytes", row key -> result}."""
    head = (f"{'model':15s} {'batch':>5s} {'input':>9s}  {'measured':33s} {'ms/step':>8s} {'img/s':>8s} "
            f"{'vs eager':>8s} {'vs compile':>10s}  {'launches/step':22s} {'memory MiB':>14s}")
    lines = ["training step, images/s (higher is better); 'vs': our images/s / PyTorch's (> 1: ours is faster)",
             head, "-" * len(head)]
    for name, row in rows.items():
        model = row["model"]
        torch_eager = _images_per_s(model, row.get("torch eager"))
        torch_compiled = _images_per_s(model, row.get("torch.compile"))
        first = True
        for key, what in TIMING_ROWS:
            result = row.get(key)
            ident = (f"{name:15s} {model.batch:5d} {f'{model.hw}x{model.hw}':>9s}" if first
                     else f"{'':15s} {'':5s} {'':9s}")
            first = False
            if result is None or "seconds" not in result:
                why = "dry run: not timed" if dry else (result or {}).get("error", "not measured")
                if dry and key.startswith("ours") and "launches" in (result or {}):
                    why = f"dry run: not timed; {result['launches']} kernels recorded"
                lines.append(f"{ident}  {what:33s} {why[:120]}")
                continue
            ips = model.batch / result["seconds"]
            ours = key.startswith("ours")
            vs_eager = f"{ips / torch_eager:.2f}" if ours and torch_eager else "-"
            vs_compiled = f"{ips / torch_compiled:.2f}" if ours and torch_compiled else "-"
            if ours:
                launches = (f"1 graph ({result['launches']} k.)" if result.get("graph") and key != "ours eager"
                            else f"{result['launches']} kernels")
                memory = f"arena {row.get('arena_bytes', 0) / MIB:.1f}"
            else:
                launches, memory = "-", f"peak {result['peak_bytes'] / MIB:.1f}"
            lines.append(f"{ident}  {what:33s} {result['seconds'] * 1e3:8.2f} {ips:8.0f} {vs_eager:>8s} "
                         f"{vs_compiled:>10s}  {launches:22s} {memory:>14s}")
    lines.append("-" * len(head))
    lines.append("* train_step(): what a user calls: host fp32->fp16 cast and copy of the batch, one sync per step. "
                 "The other 'ours' rows replay the recorded step with the batch in its arena slot.")
    lines.append("PyTorch: torch.autocast(fp16) + GradScaler + SGD(momentum 0.9, foreach), channels_last model and "
                 "batch on the GPU, cudnn.benchmark on; torch.compile(model) in its default mode, same step around it.")
    lines.append("memory: ours = the whole arena (fp32 master weights, fp16 copies, gradients, momentum, "
                 "activations, workspaces, I/O); PyTorch = torch.cuda.max_memory_allocated() over one steady-state "
                 "step after reset_peak_memory_stats().")
    for name, row in rows.items():
        lines.append(f"{name}: {row['model'].about}; PyTorch model torch_models.{row['model'].torch_model}"
                     f"({row['model'].classes})")
    return "\n".join(lines)


def timing_targets(rows):
    """The issue's targets, as lines: one graph launch per step; resnet18-CIFAR >= PyTorch eager AMP."""
    lines = []
    graphs = {name: row.get("ours graph", {}).get("graph") for name, row in rows.items()}
    lines.append("target, one graph launch per training step: " + ", ".join(
        f"{name} {'not measured' if ok is None else 'met' if ok else 'NOT met'}" for name, ok in graphs.items()))
    row = rows.get("resnet18-cifar")
    if row:
        ours, theirs = (_images_per_s(row["model"], row.get(k)) for k in ("ours graph", "torch eager"))
        if ours and theirs:
            lines.append(f"target, resnet18-cifar at least as fast as PyTorch eager AMP: {ours:.0f} vs {theirs:.0f} "
                         f"img/s -> {'met' if ours >= theirs else 'NOT met'} ({ours / theirs:.2f}x)")
        else:
            lines.append("target, resnet18-cifar at least as fast as PyTorch eager AMP: not measured")
    return lines


def run_step_sections(only, budget, failures, skipped, notes):
    """The step-* sections ``--only`` selects; returns their results for ``--json``."""
    selected, out = step_selection(only), {}
    for section, function in (("step-check", step_check), ("step-replay", step_replay),
                              ("step-timing", step_timing)):
        if section not in selected:
            continue
        print(f"\n== {section}: {SECTION_TITLES[section]} ==")
        started = time.time()
        try:
            if section == "step-timing":
                rows = function(selected[section], budget, failures, skipped, notes)
                out[section] = {name: {k: v for k, v in row.items() if k != "model"} for name, row in rows.items()}
                for line in timing_targets(rows):
                    print(line)
            else:
                out[section] = function(selected[section], budget, failures, skipped)
        except Exception as error:
            report_crash(section, error, failures)
        print(f"== {section} done in {time.time() - started:.0f} s ==")
    return out


# ---- the dry run of the step sections: plans, recorded tapes, PyTorch twins, no device

def host_arena_class():
    """``DeviceArena`` over host memory: an address-space reservation that is never touched (the dry
    run makes the executor's views and type-checks its launches; nothing is computed)."""
    import mmap
    from cuda_kernels._arena import ALIGNMENT, DeviceArena

    class HostArena(DeviceArena):
        def __init__(self, nbytes):
            self.nbytes = -(-int(nbytes) // ALIGNMENT) * ALIGNMENT
            try:   # MAP_NORESERVE: no commit charge for the gigabytes a big plan reserves
                flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
                self.buffer = np.frombuffer(mmap.mmap(-1, self.nbytes, flags=flags), np.uint8)
            except (AttributeError, OSError, ValueError):
                self.buffer = np.empty(self.nbytes, np.uint8)

        def zero(self, launcher=None):
            pass
    return HostArena


class _TapeStandIn(DryLauncher):
    """In ``LaunchTape``'s place: type-checks each launch (host stand-ins allowed) and keeps its name."""

    def __len__(self):
        return len(self.names)


class _RunnerStandIn:
    """In ``StepRunner``'s place: keeps the recorded tape."""

    def __init__(self, tape, mode="eager", allow_eager_fallback=False):
        self.tape, self.mode, self.graph, self.reason = tape, mode, None, ""


@contextmanager
def _patched(module, **names):
    """``module``'s globals ``names`` replaced for the duration; a missing one is an error."""
    missing = sorted(n for n in names if not hasattr(module, n))
    if missing:
        raise RuntimeError(f"dry run: {module.__name__} no longer has {missing}; update gpu_check.py's "
                           f"dry_record_train_step to the executor's new structure")
    saved = {n: getattr(module, n) for n in names}
    for n, value in names.items():
        setattr(module, n, value)
    try:
        yield
    finally:
        for n, value in saved.items():
            setattr(module, n, value)


def dry_record_train_step(plan, optimizer):
    """``(kernel names, classes)`` of ``plan``'s training step, recorded by ``CudaExecutor``'s own code
    (its constructor's views over a host arena, its ``_runner``) with the device-only pieces stood in
    for: no arena on a device, no initial weights written, a launcher that type-checks every launch
    against the kernel table instead of recording it for a device."""
    import cuda_kernels._executor as executor_module

    class DryExecutor(executor_module.CudaExecutor):
        def _upload_scalar(self, name, value):
            pass

        def _refresh_half_weights(self):
            self._half_dirty = False

    with _patched(executor_module, cuda_unavailable_reason=lambda: "", DeviceArena=host_arena_class(),
                  new_stream=lambda: None, initial_parameters=lambda plan, seed: {}, LaunchTape=_TapeStandIn,
                  StepRunner=_RunnerStandIn):
        ex = DryExecutor(plan, optimizer=optimizer, seed=0, replay="eager")
        runner = ex._runner(ex._variant_for(plan.variants["train"].input_shape, "train"), "train")
    return runner.tape.names, ex.classes


def _fused_kinds(plan):
    from collections import Counter
    counts = Counter(plan.arch.layers[op.layer].kind for op in plan.graphs["train"].ops if op.direction == "forward")
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))


def dry_run_steps(only, used):
    """Everything of the step-* sections that needs no device; raises on any mismatch."""
    from planner.init import torch_shape
    selected = step_selection(only)
    if not selected:
        print("step sections: none selected by --only")
        return
    print(f"\nstep sections (dry): {', '.join(selected)} — plans compiled, each training step recorded as "
          f"CudaExecutor records it, launches type-checked against the kernel table")
    models = {}
    for section, chosen in selected.items():
        for model in chosen:
            models.setdefault((model.name, model.shape), (model, []))[1].append(section)
    print(f"  {'model':24s} {'input':>17s} {'sections':34s} {'ops':>4s} {'params':>11s} {'arena MiB':>9s} "
          f"{'launches':>8s}  fused kinds")
    plans, launches = {}, {}
    for (name, shape), (model, sections) in models.items():
        started = time.time()
        plan = plans[name] = compile_step_plan(model)
        plan.verify()
        names, classes = dry_record_train_step(plan, sgd())
        used.update(names)
        launches[name] = len(names)
        assert classes == model.classes, f"{name}: the plan has {classes} classes, the model says {model.classes}"
        assert "count_correct" in names and "sgd_step" in names, f"{name}: the recorded step lacks its loss/update"
        print(f"  {name:24s} {str(shape):>17s} {', '.join(sections):34s} {len(plan.graphs['train'].ops):4d} "
              f"{plan.params_trainable:11,d} {plan.memory.arena_bytes / MIB:9.1f} {len(names):8d}  "
              f"{_fused_kinds(plan)} ({time.time() - started:.1f} s)")
    if "step-check" in selected:
        for model in selected["step-check"]:
            reference = compile_step_plan(model, fuse=False, amp=False)
            fused = {p.name: torch_shape(p) for p in plans[model.name].params}
            fp32 = {p.name: torch_shape(p) for p in reference.params}
            assert fused == fp32, f"{model.name}: the fp32 reference plan's parameters differ from the fused AMP " \
                                  f"plan's: {sorted(set(fused.items()) ^ set(fp32.items()))[:4]}"
            print(f"  step-check {model.name}: fp32 reference plan ({len(reference.graphs['train'].ops)} ops) has the "
                  f"fused AMP plan's {len(fp32)} parameter names and shapes: weights move across")
        a = {"w": np.array([3.0, 4.0]), "b": np.array([0.0, 0.0]), "c": np.array([1.0])}
        errors = relative_errors({"w": np.array([3.0, 4.1]), "b": np.array([0.05, 0.0]), "c": np.array([np.nan])}, a)
        assert math.isclose(errors["w"], 0.02) and math.isclose(errors["b"], 1.0) and errors["c"] == math.inf, errors
        print("  step-check comparison self-test (norm floor, non-finite values): ok")
    if "step-replay" in selected:
        for model in selected["step-replay"]:
            print(f"  step-replay {model.name}: graph support here: {graph_support()}")
    if "step-timing" in selected:
        dry_run_torch(selected["step-timing"], plans, launches)


def dry_run_torch(models, plans, launches):
    """The PyTorch twins of the timed models: parameter counts, names and shapes against our plans
    (on the meta device), and the timed step function run once on the CPU at a tiny size."""
    from planner.init import torch_shape
    try:
        import torch
    except Exception as error:
        print(f"  step-timing PyTorch side NOT CHECKED: PyTorch is not importable ({error})")
        return
    for model in models:
        plan = plans[model.name]
        with torch.device("meta"):
            twin = model.make_torch()
        count = torch_models().count_params(twin)
        theirs = {k: tuple(v.shape) for k, v in twin.state_dict().items()}
        ours = {p.name: torch_shape(p) for p in plan.params}
        assert count == plan.params_trainable, f"{model.name}: torch_models.{model.torch_model} has {count:,} " \
                                               f"parameters, our plan {plan.params_trainable:,}"
        assert theirs == ours, f"{model.name}: state_dict names/shapes differ: " \
                               f"{sorted(set(theirs.items()) ^ set(ours.items()))[:4]}"
        started = time.time()
        tiny = StepModel(model.name, model.blueprint, 2, 32, model.about, model.classes, model.torch_model)
        net = model.make_torch().to(memory_format=torch.channels_last).train()
        x, y = torch_inputs(tiny, "cpu")
        step = make_torch_step(net, x, y, "cpu", amp=False)
        losses = [float(step().detach()) for _ in range(2)]
        assert all(math.isfinite(v) for v in losses), f"{model.name}: PyTorch CPU step gave {losses}"
        print(f"  step-timing {model.name}: torch_models.{model.torch_model}({model.classes}) has our plan's "
              f"{count:,} parameters and {len(ours)} state_dict names/shapes; its timed step ran on the CPU at "
              f"batch 2, 32x32 without AMP: losses {losses[0]:.3f}, {losses[1]:.3f} ({time.time() - started:.1f} s)")
    print("  step-timing: torch.compile is not exercised in the dry run (minutes of compiling on a CPU); "
          "on the GPU its failures are printed and noted, not fatal")
    rows = {}
    for model in models:
        recorded = {"launches": launches[model.name]}
        rows[model.name] = {"model": model, "arena_bytes": plans[model.name].memory.arena_bytes,
                            "ours eager": recorded, "ours graph": recorded}
    print(format_timing_table(rows, dry=True))


def dry_run(only):
    started = time.time()
    kernels = all_kernels()
    used = set()
    for batch, label in [(CHECK_BATCH, "cross-check"), (TIMING_BATCH, "timing")]:
        rows = {n: b for n, b in table(batch).items() if only in n}
        print(f"{label} rows at batch {batch}:")
        for name, build in rows.items():
            case = build(HostStandIns(), None)
            launcher = DryLauncher()
            case.record(launcher)
            used.update(launcher.names)
            outputs = ", ".join(f"{k}{tuple(v.shape)}" for k, v in case.outputs.items())
            print(f"  {name:28s} {len(launcher.names)} launches ({', '.join(dict.fromkeys(launcher.names))}) -> "
                  f"{outputs}; {case.bytes / 1e6:.1f} MB moved")
    record, _ = graph_case(HostStandIns())
    launcher = DryLauncher()
    record(launcher)
    used.update(launcher.names)
    print(f"graph-vs-eager: {len(launcher.names)} launches; graph support here: {graph_support()}")
    dry_run_steps(only, used)
    unknown, unused = used - set(kernels), set(kernels) - used
    assert not unknown, f"launched kernels missing from the table: {sorted(unknown)}"
    if not only:
        assert not unused, f"kernels the GPU check never runs: {sorted(unused)}"
    print(f"dry run ok: {len(used)} of {len(kernels)} table kernels would run ({time.time() - started:.1f} s)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU-side self-test; no GPU needed")
    parser.add_argument("--only", default="", help="run the kernel rows whose name contains this, and the step "
                        f"sections ({', '.join(STEP_SECTIONS)}) or their models whose name contains it")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                        help="seconds for the whole run; later units that no longer fit are reported as not run")
    args = parser.parse_args(argv)
    if args.dry_run:
        dry_run(args.only)
        return 0
    if not cuda.is_available():
        print("gpu_check: no CUDA GPU here; use --dry-run for the CPU self-test", file=sys.stderr)
        return 2
    stream, started = new_stream(), time.time()
    budget = Budget(args.budget, started)
    print(f"device: {cuda.get_current_device().name}; budget {args.budget:.0f} s")
    failures, skipped, notes = [], [], []
    report, graph = [], {}
    cross_rows = {n: b for n, b in table(CHECK_BATCH).items() if args.only in n}
    if cross_rows:
        try:
            print(f"cross-checks at batch {CHECK_BATCH}:")
            failures += cross_check(cross_rows, stream)
            print(f"timings at batch {TIMING_BATCH} (eager tape replay, events on one stream):")
            report = timing_table({n: b for n, b in table(TIMING_BATCH).items() if args.only in n}, stream)
        except Exception as error:   # the step sections still run
            report_crash("kernel rows", error, failures)
        print(f"kernel sections done at {time.time() - started:.0f} s")
    else:
        print(f"kernel rows: none match --only {args.only!r}")
    if not args.only or args.only in "graph-vs-eager":
        try:
            eager_us, graph_us, launches, graph_failures = graph_check(stream)
            failures += graph_failures
            graph = dict(eager_us=eager_us, graph_us=graph_us, launches=launches)
            print(f"graph vs eager, {launches} launches per step: eager {eager_us:.1f} us, graph {graph_us:.1f} us")
        except Exception as error:
            report_crash("graph-vs-eager (hand-made tape)", error, failures)
    else:
        print(f"graph-vs-eager (hand-made tape): not selected by --only {args.only!r}")
    steps = run_step_sections(args.only, budget, failures, skipped, notes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(timings=report, graph=graph, steps=steps, failures=failures, not_run=skipped, notes=notes),
                      f, indent=1, default=_json_default)
    print()
    for note in notes:
        print(f"note: {note}")
    for line in skipped:
        print(f"NOT RUN: {line}")
    verdict = "FAILED: " + "; ".join(failures) if failures else ("INCOMPLETE (see NOT RUN)" if skipped else
                                                                   "all checks passed")
    print(f"{verdict} ({time.time() - started:.0f} s)")
    return 1 if failures or skipped else 0


def _json_default(value):
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, StepModel):
        return value.name
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
