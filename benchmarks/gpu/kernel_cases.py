"""The kernel rows of the GPU check: device memory and its ``--dry-run`` host stand-ins, and the
case table (per row: its launches, its outputs, the numpy spec's answer, its work)."""
import math
from dataclasses import dataclass, field

import numpy as np
from numba import cuda

from planner import reference as ref
from planner.ops import ACTIVATIONS, OPS, Prim
from cuda_kernels import batchnorm, channel_mul, drop_path, elementwise, loss, optim, pool, prelu
from cuda_kernels.collective import StepCollectives
from cuda_kernels.mma_ops import GEMM_KERNELS, gemm_kernels
from cuda_kernels.registry import check_args

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


def conv_case(mem, rng, batch, h, w, cin, cout, k, s, p, groups, direction, with_stats=True, kernels="simt"):
    """One convolution through the plan-level launchers of ``kernels`` ("simt" | "mma", ``mma_ops``)."""
    family = gemm_kernels(kernels)
    (hx, x), (hw, wt) = mem.random(rng, (batch, h, w, cin), np.float16), mem.random(
        rng, (cout, k, k, cin // groups), np.float16, 1.0 / math.sqrt(k * k * cin / groups))
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    macs = batch * oh * ow * cout * k * k * cin / groups
    if direction == "fwd":
        y = mem.output((batch, oh, ow, cout), np.float16)
        sums = (mem.output(cout, np.float32), mem.output(cout, np.float32)) if with_stats else None
        expected = lambda: {"y": (ref.conv2d_forward(f32(hx), f32(hw), s, p, groups), "fp16")}  # noqa: E731
        return Case(lambda t: family.conv2d_forward(t, x, wt, y, s, p, groups, bn_sums=sums), {"y": y}, expected,
                    2 * macs, 2 * (x.size + wt.size + y.size))
    hdy, dy = mem.random(rng, (batch, oh, ow, cout), np.float16)
    dx, dw = mem.output((batch, h, w, cin), np.float16), mem.output(wt.shape, np.float32)

    def expected():
        rdx, rdw = ref.conv2d_backward(f32(hx), f32(hw), f32(hdy), s, p, groups)
        return {"dx": (rdx, "fp16"), "dw": (rdw, "fp32")}
    return Case(lambda t: family.conv2d_backward(t, x, wt, dy, dx, dw, s, p, groups, False), {"dx": dx, "dw": dw},
                expected, 4 * macs, 2 * (2 * x.size + dy.size) + 6 * wt.size)


class _PeerWithZeroGradient(StepCollectives):
    """Sync BN beside one other replica whose ``dy`` is 0 on a shard as large: the sums stay this replica's,
    the rows double. No all-reduce runs (one process); the BN kernels take the synchronised branch."""
    world_size, sync_batchnorm = 2, True

    def batchnorm_sums(self, launcher, what, *sums):
        return self.world_size

    def batchnorm_replicas(self):
        return self.world_size


def batchnorm_case(mem, rng, rows, channels, direction):
    """``direction``: "fwd", "bwd", or "bwd sync" (``_PeerWithZeroGradient``: the spec over both shards)."""
    (hx, x), (hg, gamma) = mem.random(rng, (rows, channels), np.float16), mem.random(rng, channels, np.float32)
    (hb, beta), y = mem.random(rng, channels, np.float32), mem.output((rows, channels), np.float16)
    sums, sumsq = mem.output(channels, np.float32), mem.output(channels, np.float32)   # the saved statistics
    rm, rv = mem.constant(np.zeros(channels, np.float32)), mem.constant(np.ones(channels, np.float32))
    if direction == "fwd":
        def expected():
            ry, _, _, _, _ = ref.batchnorm_forward_train(f32(hx), hg, hb, np.zeros(channels), np.ones(channels),
                                                         0.1, 1e-5)
            return {"y": (np.maximum(ry, 0), "fp16"), "sum": (f32(hx).sum(0), "stats"),
                    "sum of squares": ((f32(hx) ** 2).sum(0), "stats")}
        return Case(lambda t: batchnorm.batchnorm_forward_train(t, x, gamma, beta, y, sums, sumsq, rm, rv, 0.1,
                                                                 1e-5, activation="relu"),
                    {"y": y, "sum": sums, "sum of squares": sumsq}, expected, 0, 3 * 2 * x.size)
    hmean, hinv = hx.astype(np.float32).mean(0), 1 / np.sqrt(hx.astype(np.float32).var(0) + 1e-5)
    hdy, dy = mem.random(rng, (rows, channels), np.float16)
    dx, dgamma, dbeta = mem.output((rows, channels), np.float16), mem.output(channels, np.float32), mem.output(
        channels, np.float32)

    synced = direction == "bwd sync"
    collectives = _PeerWithZeroGradient() if synced else StepCollectives()
    shards = 2 if synced else 1   # the peer's shard: any x (its dy is 0), here this one's: the global sums
    ssum = mem.constant((f32(hx).sum(0) * shards).astype(np.float32))
    ssumsq = mem.constant(((f32(hx) ** 2).sum(0) * shards).astype(np.float32))

    def expected():
        rdx, rdg, rdb = ref.batchnorm_backward(np.concatenate([f32(hx)] * shards), hg, hmean, hinv,
                                               np.concatenate([f32(hdy)] + [np.zeros_like(f32(hdy))] * (shards - 1)))
        return {"dx": (rdx[:rows], "fp16"), "dgamma": (rdg / shards, "fp32"), "dbeta": (rdb / shards, "fp32")}
    return Case(lambda t: batchnorm.batchnorm_backward(t, x, gamma, ssum, ssumsq, dy, dx, dgamma, dbeta, False,
                                                        eps=1e-5, collectives=collectives),
                {"dx": dx, "dgamma": dgamma, "dbeta": dbeta}, expected, 0, 5 * 2 * x.size)


def _params(prim):
    """0.1 for each of the activation's parameters (its row's attrs), as the kernels and the reference take them."""
    return (0.1,) * len(OPS[prim].attrs)


def activation_case(mem, rng, n, prim):
    (hx, x), y = mem.random(rng, n, np.float16, 3.0), mem.output(n, np.float16)
    return Case(lambda t: elementwise.activation_forward(t, prim, x, y, _params(prim)), {"y": y},
                lambda: {"y": (OPS[prim].reference_forward(f32(hx), *_params(prim)), "fp16")}, 0, 4 * n)


def activations_case(mem, rng, n):
    """Forward and backward of every activation of the op table (its two generated kernels each)."""
    (hx, x), (hdy, dy) = mem.random(rng, n, np.float16, 3.0), mem.random(rng, n, np.float16)
    outs = {prim: (mem.output(n, np.float16), mem.output(n, np.float16)) for prim in ACTIVATIONS}

    def record(t):
        for prim, (y, dx) in outs.items():
            elementwise.activation_forward(t, prim, x, y, _params(prim))
            elementwise.activation_backward(t, prim, x, dy, dx, _params(prim), False)   # x stands for the saved value

    def expected():
        x64, dy64 = hx.astype(np.float64), hdy.astype(np.float64)
        return {label: (value, "fp16") for prim in ACTIVATIONS for label, value in (
            (f"{prim.value} y", OPS[prim].reference_forward(x64, *_params(prim))),
            (f"{prim.value} dx", OPS[prim].reference_backward(x64, dy64, *_params(prim))))}
    outputs = {f"{prim.value} {which}": array for prim, pair in outs.items() for which, array in zip(("y", "dx"), pair)}
    return Case(record, outputs, expected, 0, 10 * n * len(ACTIVATIONS))   # fp16: x, y; x, dy, dx


def dropout_case(mem, rng, n):
    (hx, x), y, mask = mem.random(rng, n, np.float16), mem.output(n, np.float16), mem.output(n, np.uint8)
    step = mem.constant(np.array([17], np.int32))

    def expected():
        ry, rmask = ref.dropout_forward(f32(hx), 0.1, 99, 17)
        return {"y": (ry, "fp16"), "mask": (rmask, "exact")}
    return Case(lambda t: elementwise.dropout_forward(t, x, y, mask, 0.1, 99, step), {"y": y, "mask": mask},
                expected, 0, 5 * n)


def linear_case(mem, rng, batch, f_in, f_out, direction, kernels="simt"):
    family = gemm_kernels(kernels)
    (hx, x), (hw, w) = mem.random(rng, (batch, f_in), np.float16), mem.random(rng, (f_out, f_in), np.float16, 0.05)
    (hb, b), y = mem.random(rng, f_out, np.float32), mem.output((batch, f_out), np.float16)
    if direction == "fwd":
        return Case(lambda t: family.linear_forward(t, x, w, b, y), {"y": y},
                    lambda: {"y": (ref.linear_forward(f32(hx), f32(hw), hb), "fp16")}, 2 * batch * f_in * f_out,
                    2 * (x.size + w.size + y.size))
    hdy, dy = mem.random(rng, (batch, f_out), np.float16)
    dx, dw, db = mem.output((batch, f_in), np.float16), mem.output((f_out, f_in), np.float32), mem.output(
        f_out, np.float32)

    def expected():
        rdx, rdw, rdb = ref.linear_backward(f32(hx), f32(hw), f32(hdy))
        return {"dx": (rdx, "fp16"), "dw": (rdw, "fp32"), "db": (rdb, "fp32")}
    return Case(lambda t: family.linear_backward(t, x, w, dy, dx, dw, db, False), {"dx": dx, "dw": dw, "db": db},
                expected, 4 * batch * f_in * f_out, 2 * (2 * x.size + dy.size) + 8 * w.size)


def softmax_case(mem, rng, batch, classes):
    (hl, logits), (hy, labels) = mem.random(rng, (batch, classes), np.float16, 3.0), mem.random(
        rng, batch, np.int32, classes)
    loss_out, dl, scale = mem.output(1, np.float32), mem.output((batch, classes), np.float16), mem.constant(
        np.array([1024.0], np.float32))

    correct = mem.output(1, np.int32)

    def record(t):
        loss.softmax_cross_entropy(t, logits, labels, 0.1, loss_out, dl, scale)
        loss.count_correct(t, logits, labels, correct)

    def expected():
        rl, rdl = ref.softmax_cross_entropy(f32(hl), hy, 0.1, 1024.0)
        hits = np.array([np.count_nonzero(f32(hl).argmax(1) == hy)], np.int32)
        return {"loss": (np.array([rl], np.float32), "fp32"), "dlogits": (rdl, "fp16"), "correct": (hits, "exact")}
    return Case(record, {"loss": loss_out, "dlogits": dl, "correct": correct}, expected, 0, 4 * logits.size)


def maxpool_case(mem, rng, batch, h, c):
    (hx, x), oh = mem.random(rng, (batch, h, h, c), np.float16), (h + 2 - 3) // 2 + 1
    y, argmax = mem.output((batch, oh, oh, c), np.float16), mem.output((batch, oh, oh, c), np.int32)

    def expected():
        ry, ra = ref.maxpool_forward(f32(hx), 3, 2, 1)
        return {"y": (ry, "exact"), "argmax": (ra, "exact")}
    return Case(lambda t: pool.maxpool_forward(t, x, y, argmax, 3, 2, 1), {"y": y, "argmax": argmax}, expected,
                0, 2 * x.size + 6 * y.size)


def gap_case(mem, rng, batch, h, c):
    (hx, x), y = mem.random(rng, (batch, h, h, c), np.float16), mem.output((batch, c), np.float16)
    return Case(lambda t: pool.gap_forward(t, x, y), {"y": y}, lambda: {"y": (ref.gap_forward(f32(hx)), "fp16")},
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
    return Case(lambda t: optim.adam_step(t, p, g, m, v, lr, step, scale, flag, 0.9, 0.999, 1e-8, 1e-2, True),
                {"p": p, "m": m, "v": v}, expected, 0, 4 * 7 * n)


def overflow_and_cast_case(mem, rng, n):
    (hp, p), flag, p16 = mem.random(rng, n, np.float32), mem.output(1, np.int32), mem.output(n, np.float16)

    def record(t):
        optim.check_overflow(t, p, flag)
        elementwise.cast_f32_to_f16(t, p, p16)
    return Case(record, {"found_inf": flag, "p16": p16},
                lambda: {"found_inf": (np.zeros(1, np.int32), "exact"), "p16": (hp.astype(np.float16), "exact")},
                0, 4 * n + 6 * n)


def elementwise_case(mem, rng, n, c=16):
    """The small elementwise kernels in one row: activation backward, add, accumulate, channel
    pad, dropout backward, fp16 zeroing (``n * c`` odd: the one-element kernels; the pad to 24 channels
    takes its 16-byte stores, the pad to ``c + 5`` its one-element twin)."""
    (hx, x), (hdy, dy) = mem.random(rng, (n, c), np.float16, 3.0), mem.random(rng, (n, c), np.float16)
    (hm, mask), dx = mem.random(rng, (n, c), np.uint8, 2), mem.output((n, c), np.float16)
    added, acc = mem.output((n, c), np.float16), mem.constant(hdy)
    padded, unpadded = mem.output((n, 24), np.float16), mem.output((n, c), np.float16)
    padded_odd = mem.output((n, c + 5), np.float16)
    dropped, zeroed = mem.output((n, c), np.float16), mem.constant(hdy)

    def record(t):
        elementwise.activation_backward(t, Prim.HARDSWISH, x, dy, dx, (), False)
        elementwise.add_forward(t, x, dy, added)
        elementwise.accumulate_into(t, acc, x, True)
        elementwise.channel_pad_forward(t, x, padded)
        elementwise.channel_pad_forward(t, x, padded_odd)
        elementwise.channel_pad_backward(t, padded, unpadded, False)
        elementwise.dropout_backward(t, mask, dy, dropped, 0.2, False)
        elementwise.fill_zero(t, zeroed)

    def expected():
        x64, dy64 = hx.astype(np.float64), hdy.astype(np.float64)
        return {"dx": (ref.hardswish_grad(x64, dy64, 0.1), "fp16"),
                "add": (x64 + dy64, "fp16"), "accumulate": (x64 + dy64, "fp16"),
                "pad": (ref.channel_pad_forward(hx, 24), "exact"), "unpad": (hx, "exact"),
                "pad odd": (ref.channel_pad_forward(hx, c + 5), "exact"),
                "dropout dx": (ref.dropout_backward(hm, dy64, 0.2), "fp16"), "zero": (np.zeros_like(hdy), "exact")}
    return Case(record, {"dx": dx, "add": added, "accumulate": acc, "pad": padded, "unpad": unpadded,
                         "pad odd": padded_odd, "dropout dx": dropped, "zero": zeroed}, expected, 0, 2 * 16 * n * c)


def squeeze_excitation_case(mem, rng, batch, h, c):
    """The squeeze-excitation scale (channel_mul forward and both gradients), stochastic depth
    (drop_path forward and backward) and prelu (per-channel slopes) at an EfficientNet stage's shape."""
    (hx, x), (hs, s) = mem.random(rng, (batch, h, h, c), np.float16), mem.random(rng, (batch, c), np.float16)
    hdy, dy = mem.random(rng, (batch, h, h, c), np.float16)
    y, dx, ds = mem.output(hx.shape, np.float16), mem.output(hx.shape, np.float16), mem.output(hs.shape, np.float16)
    dropped, mask, ddropped = (mem.output(shape, t) for shape, t in ((hx.shape, np.float16), (batch, np.uint8),
                                                                     (hx.shape, np.float16)))
    step = mem.constant(np.array([17], np.int32))
    (hw, w), py, pdx, pdw = (mem.random(rng, c, np.float32), mem.output(hx.shape, np.float16),
                             mem.output(hx.shape, np.float16), mem.output(c, np.float32))

    def record(t):
        prelu.prelu_forward(t, x, w, py)
        prelu.prelu_backward(t, x, w, dy, pdx, pdw, False)
        channel_mul.channel_mul_forward(t, x, s, y)
        channel_mul.channel_mul_backward(t, x, s, dy, dx, ds, False, False)
        drop_path.drop_path_forward(t, x, dropped, mask, 0.2, 99, step)
        drop_path.drop_path_backward(t, mask, dy, ddropped, 0.2, False)

    def expected():
        x64, s64, dy64 = (a.astype(np.float64) for a in (hx, hs, hdy))
        rdx, rds = ref.channel_mul_backward(x64, s64, dy64)
        ry, rmask = ref.drop_path_forward(x64, 0.2, 99, 17)
        prelu_dx, prelu_dw = ref.prelu_backward(x64, hw.astype(np.float64), dy64)
        return {"prelu y": (ref.prelu_forward(x64, hw.astype(np.float64)), "fp16"), "prelu dx": (prelu_dx, "fp16"),
                "prelu dw": (prelu_dw, "fp32"),
                "y": (ref.channel_mul_forward(x64, s64), "fp16"), "dx": (rdx, "fp16"), "ds": (rds, "fp16"),
                "drop_path y": (ry, "fp16"), "drop_path mask": (rmask, "exact"),
                "drop_path dx": (ref.drop_path_backward(rmask, dy64, 0.2), "fp16")}
    return Case(record, {"y": y, "dx": dx, "ds": ds, "drop_path y": dropped, "drop_path mask": mask,
                         "drop_path dx": ddropped, "prelu y": py, "prelu dx": pdx, "prelu dw": pdw}, expected,
                3 * hx.size, 2 * 16 * hx.size)


def pool_backward_case(mem, rng, batch, h, c):
    """maxpool / avgpool forward+backward and the global-average-pool backward."""
    (hx, x), oh = mem.random(rng, (batch, h, h, c), np.float16), (h + 2 - 3) // 2 + 1
    (hdy, dy), (hgy, gdy) = mem.random(rng, (batch, oh, oh, c), np.float16), mem.random(rng, (batch, c), np.float16)
    y, argmax, avg = (mem.output((batch, oh, oh, c), t) for t in (np.float16, np.int32, np.float16))
    dx_max, dx_avg, dx_gap = (mem.output((batch, h, h, c), np.float16) for _ in range(3))

    def record(t):
        pool.maxpool_forward(t, x, y, argmax, 3, 2, 1)
        pool.maxpool_backward(t, argmax, dy, dx_max, 3, 2, 1, False)
        pool.avgpool_forward(t, x, avg, 3, 2, 1)
        pool.avgpool_backward(t, dy, dx_avg, 3, 2, 1, False)
        pool.gap_backward(t, gdy, dx_gap, False)

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
        batchnorm.batchnorm_forward_eval(t, x, gamma, beta, rm, rv, 1e-5, y, activation="relu", residual=res)
        optim.sgd_step(t, p, g, buf, lr, step, scale, flag, 0.9, 0.0, True, 1e-4)

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
    "depthwise3x3-144": (28, 28, 144, 144, 3, 1, 1, 144),   # 8-channel vectors
    "depthwise3x3-36": (28, 28, 36, 36, 3, 1, 1, 36),       # 36 % 8 != 0: the one-element kernels
}


def conv_families(shape):
    """The kernel families a convolution row runs with: both, unless grouped (SIMT only)."""
    groups = shape[-1]
    return ("simt",) if groups > 1 else tuple(GEMM_KERNELS)


def table(batch):
    """``name -> builder(mem, rng)`` for every row; ``batch`` scales the activations. Every convolution
    and linear row runs once per kernel family (name suffix " simt" / " mma"), on the same shapes;
    depthwise convolutions only as " simt" (the "mma" family hands them to the SIMT kernels)."""
    rows = {}
    for i, (name, shape) in enumerate(CONV_SHAPES.items()):   # every other forward with the BN-stats epilogue
        for kernels in conv_families(shape):
            rows[f"{name} fwd" + (" +stats" if i % 2 == 0 else "") + f" {kernels}"] = \
                lambda mem, rng, s=shape, st=i % 2 == 0, kn=kernels: conv_case(mem, rng, batch, *s, "fwd", st, kn)
            rows[f"{name} bwd {kernels}"] = lambda mem, rng, s=shape, kn=kernels: conv_case(
                mem, rng, batch, *s, "bwd", kernels=kn)
    for direction in ("fwd", "bwd"):
        rows[f"batchnorm 64ch {direction}"] = lambda mem, rng, d=direction: batchnorm_case(
            mem, rng, batch * 32 * 32, 64, d)
        for kernels in GEMM_KERNELS:
            rows[f"linear 512-1000 {direction} {kernels}"] = lambda mem, rng, d=direction, kn=kernels: linear_case(
                mem, rng, batch, 512, 1000, d, kn)
    rows["batchnorm 64ch bwd sync"] = lambda mem, rng: batchnorm_case(mem, rng, batch * 32 * 32, 64, "bwd sync")
    rows["gelu"] = lambda mem, rng: activation_case(mem, rng, batch * 32 * 32 * 64, Prim.GELU)
    rows["activations"] = lambda mem, rng: activations_case(mem, rng, batch * 1024)
    rows["dropout"] = lambda mem, rng: dropout_case(mem, rng, batch * 4096)
    rows["maxpool 3-2-1"] = lambda mem, rng: maxpool_case(mem, rng, batch, 32, 64)
    rows["gap 8x8x512"] = lambda mem, rng: gap_case(mem, rng, batch, 8, 512)
    rows["softmax-ce 1000"] = lambda mem, rng: softmax_case(mem, rng, batch, 1000)
    rows["pool backward"] = lambda mem, rng: pool_backward_case(mem, rng, batch, 32, 64)
    rows["squeeze-excitation + drop_path 14x14x480"] = lambda mem, rng: squeeze_excitation_case(
        mem, rng, batch, 14, 480)
    rows["elementwise small"] = lambda mem, rng: elementwise_case(mem, rng, batch * 1024)
    rows["bn eval residual + sgd"] = lambda mem, rng: residual_bn_case(mem, rng, batch * 1024, 64)
    n_params = PARAMETERS if batch == TIMING_BATCH else 1 << 16
    rows["adamw region"] = lambda mem, rng: adam_case(mem, rng, n_params)
    rows["overflow+cast region"] = lambda mem, rng: overflow_and_cast_case(mem, rng, n_params)
    # The one-element twins of the 16-byte vector kernels (cuda_kernels.vector): channels % 8 != 0, odd sizes
    for direction in ("fwd", "bwd"):
        rows[f"batchnorm 60ch {direction}"] = lambda mem, rng, d=direction: batchnorm_case(
            mem, rng, batch * 32 * 32, 60, d)
    rows["activations one-element"] = lambda mem, rng: activations_case(mem, rng, batch * 1024 + 3)
    rows["maxpool 3-2-1 60ch"] = lambda mem, rng: maxpool_case(mem, rng, batch, 32, 60)
    rows["gap 8x8x60"] = lambda mem, rng: gap_case(mem, rng, batch, 8, 60)
    rows["pool backward 60ch"] = lambda mem, rng: pool_backward_case(mem, rng, batch, 32, 60)
    rows["elementwise small one-element"] = lambda mem, rng: elementwise_case(mem, rng, batch * 1024 + 1, 15)
    rows["bn eval residual + sgd one-element"] = lambda mem, rng: residual_bn_case(mem, rng, batch * 1024 + 1, 60)
    rows["adamw region one-element"] = lambda mem, rng: adam_case(mem, rng, (1 << 16) + 1)
    rows["overflow+cast region one-element"] = lambda mem, rng: overflow_and_cast_case(mem, rng, (1 << 16) + 1)
    return rows
