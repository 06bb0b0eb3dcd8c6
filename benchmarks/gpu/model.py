"""A performance model of a training step on an H200: PREDICTIONS, never measurements.

Per GEMM (forward, input gradient, weight gradient of each convolution) with the tile and kernel
the executor picks: blocks per SM from registers / shared memory / threads; per k-tile and SM
three times, of which the largest bounds it:

- the tensor cores: mma.sync at ``mma_sync_share`` (60%) of the dense fp16 peak;
- shared memory: ldmatrix reads + cp.async writes at 128 B/clock;
- instruction issue: the kernel's main-loop instructions per warp and k-tile, read from its SASS
  (``sass_counts.json``: instructions per HMMA x HMMAs per warp and k-tile), over 4 schedulers
  issuing one instruction per clock. This is what makes a slow loop slow in the model.

Then waves of 132 SMs (quantisation); HBM bytes (every operand once) and L2 bytes (A once per
column of tiles, B once per row); the GEMM's time is the largest of these plus a launch.

Outside the GEMMs (``predict_step``): every other kernel of the recorded step is counted by its
bytes (read + written, from the tape: ``--dry-run``) at 4.3 TB/s, the bandwidth a streaming
kernel reaches on an H200 (measured elsewhere, 90% of the 4.8 TB/s datasheet figure), plus one
launch gap each. SIMT GEMMs: issue-bound, 4 instructions per FFMA (its SASS, CUDA-NOTES.md) at
20% of the issue slots, calibrated to issue 12's 2-3.5 TFLOP/s estimate; its input gradient
gathers with s^2 the work. The H200 figures are the datasheet's; the mma.sync share is an
assumption (wgmma reaches the peak on Hopper). ``gpu_check.py`` prints measured beside predicted on
a GPU, which tells model from kernel.
"""
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cuda_kernels.mma_dgrad import DGRAD_TILES
from cuda_kernels.mma_tiles import BK, choose_tile, pipeline_bytes
from cuda_kernels.mma_wgrad import WGRAD_TILES


@dataclass(frozen=True)
class Gpu:
    name: str = "H200 SXM"
    sms: int = 132
    clock_hz: float = 1.98e9
    tensor_fp16_flops: float = 989e12     # dense fp16 in, fp32 accumulate (datasheet)
    mma_sync_share: float = 0.60          # assumption: mma.sync vs wgmma on Hopper
    schedulers: int = 4                   # warp schedulers per SM, one instruction per clock each
    smem_bytes_per_clock: int = 128       # per SM
    shared_per_sm: int = 228 * 1024
    registers_per_sm: int = 65536
    hbm_bytes_s: float = 4.8e12
    streaming_bytes_s: float = 4.3e12     # what a streaming kernel reaches (measured elsewhere)
    l2_bytes_s: float = 10e12             # assumption
    launch_s: float = 2e-6                # graph-replayed kernel
    simt_issue_share: float = 0.20        # SIMT calibration (see the module docstring)


H200 = Gpu()
# registers per thread of each tile's kernels, an upper bound (ptxas -v, sm_80 and sm_90): the design budget
DESIGN_REGISTERS = {256: 200, 128: 216, 64: 176, 32: 240}   # 64: the 128x32 tile, 32: the 128x16 tile


def blocks_per_sm(tile, shared_bytes, gpu=H200):
    by_regs = gpu.registers_per_sm // (DESIGN_REGISTERS[tile.threads] * tile.threads)
    return max(1, min(by_regs, gpu.shared_per_sm // shared_bytes, 2048 // tile.threads))


@dataclass(frozen=True)
class Prediction:
    seconds: float
    flops: float
    tile: str
    bound: str

    @property
    def tflops(self):
        return self.flops / self.seconds / 1e12


SASS_COUNTS = Path(__file__).with_name("sass_counts.json")


@lru_cache(maxsize=None)
def sass_counts(path=SASS_COUNTS):
    """``{kernel: main-loop instructions per HMMA}`` (sm_90), as ``python -m benchmarks.sass_report --counts``
    wrote them; the SASS tier checks them against the kernels' code (``test_sass_budget.py``)."""
    return json.loads(Path(path).read_text())["per_hmma"]


def loop_instructions(kernel, tile):
    """Main-loop instructions one warp issues per k-tile: instructions per HMMA x HMMAs per warp and k-tile."""
    return sass_counts()[kernel] * tile.mi * tile.ni * (BK // 16)


def k_tile_bounds(kernel, tile, resident, gpu=H200):
    """Seconds one SM needs for one k-tile of each of its ``resident`` blocks of ``kernel``, by each bound:
    ``(tensor cores, shared memory, instruction issue)``."""
    sm_rate = gpu.tensor_fp16_flops * gpu.mma_sync_share / gpu.sms
    t_mma = resident * 2.0 * tile.bm * tile.bn * BK / sm_rate
    warps = tile.threads // 32
    smem = warps * (tile.mi * 16 + tile.ni * 8) * BK * 2 + (tile.bm + tile.bn) * BK * 2
    t_smem = resident * smem / (gpu.smem_bytes_per_clock * gpu.clock_hz)
    # a warp issues at most one instruction per clock: fewer warps than schedulers leave some idle
    t_issue = (resident * warps * loop_instructions(kernel, tile)
               / (min(gpu.schedulers, resident * warps) * gpu.clock_hz))
    return t_mma, t_smem, t_issue


def predict_gemm(m, n, k, tile, shared_bytes, hbm_bytes, kernel, groups_z=1, k_per_block=None, gpu=H200):
    """Predicted time of one launch of tensor-core ``kernel``: ``groups_z`` independent GEMMs of m x n x k
    (implicit operands: ``hbm_bytes`` is what the tensors themselves hold; L2 serves the re-reads)."""
    flops = 2.0 * m * n * k * groups_z
    k_per_block = k_per_block or k
    splits = math.ceil(k / k_per_block)
    blocks = math.ceil(m / tile.bm) * math.ceil(n / tile.bn) * splits * groups_z
    # blocks sharing an SM at once: no more than the grid gives it (a grid of 2 blocks per SM is not charged 8)
    resident = min(blocks_per_sm(tile, shared_bytes, gpu), math.ceil(blocks / gpu.sms))
    t_mma, t_smem, t_issue = k_tile_bounds(kernel, tile, resident, gpu)
    waves = math.ceil(blocks / (gpu.sms * resident))
    t_compute = waves * math.ceil(k_per_block / BK) * max(t_mma, t_smem, t_issue)
    t_hbm = hbm_bytes / gpu.hbm_bytes_s
    t_l2 = 2.0 * groups_z * (m * k * math.ceil(n / tile.bn) + k * n * math.ceil(m / tile.bm)) / gpu.l2_bytes_s
    unit = max((t_mma, "tensor cores"), (t_smem, "shared memory"), (t_issue, "instruction issue"))[1]
    times = {unit: t_compute, "HBM": t_hbm, "L2": t_l2}
    bound = max(times, key=times.get)
    return Prediction(times[bound] + gpu.launch_s, flops, tile.name, bound)


def predict_simt(flops, gpu=H200):
    rate = gpu.sms * 4 * gpu.clock_hz * 32 * 2 / 4 * gpu.simt_issue_share
    return Prediction(flops / rate + gpu.launch_s, flops, "simt", "issue")


@dataclass(frozen=True)
class ConvShape:
    name: str
    batch: int
    hw: int          # input height = width
    c_in: int
    c_out: int
    kernel: int
    stride: int
    pad: int
    first: bool = False   # the network's first convolution: its input needs no gradient

    @property
    def out_hw(self):
        return (self.hw + 2 * self.pad - self.kernel) // self.stride + 1


def _wgrad_splits(c, tile, gpu):
    """The pixel splits ``_conv._reduction_split`` gives the weight gradient (two blocks per SM)."""
    blocks = math.ceil(c.c_out / tile.bm) * math.ceil(c.kernel ** 2 * c.c_in / tile.bn)
    return max(1, min(math.ceil(2 * gpu.sms / blocks), math.ceil(c.batch * c.out_hw ** 2 / (8 * BK))))


FORWARD, DGRAD, WGRAD = "mma_conv2d_forward_bn_stats", "mma_conv2d_backward_data", "mma_conv2d_backward_weight"


def kernel_name(family, tile):
    """The tensor-core kernel of ``family`` (forward: the BN-statistics epilogue, as a convolution followed by
    BatchNorm runs) for ``tile``."""
    return f"{family}_{tile.name}"


def predict_conv(c, gpu=H200):
    """``{"forward" | "dgrad" | "wgrad": (mma Prediction or None, simt Prediction)}`` of one convolution."""
    pixels_out, taps = c.batch * c.out_hw ** 2, c.kernel ** 2
    flops = 2.0 * pixels_out * c.c_out * taps * c.c_in
    simt = {"forward": predict_simt(flops), "dgrad": predict_simt(flops * c.stride ** 2),
            "wgrad": predict_simt(flops)}
    if c.first:
        del simt["dgrad"]
    x_bytes, w_bytes, y_bytes = 2.0 * c.batch * c.hw ** 2 * c.c_in, 2.0 * taps * c.c_in * c.c_out, 2.0 * pixels_out * c.c_out
    fwd = choose_tile(pixels_out, c.c_out)
    forward = (predict_gemm(pixels_out, c.c_out, taps * c.c_in, fwd, pipeline_bytes(fwd, False, False),
                            x_bytes + w_bytes + y_bytes, kernel_name(FORWARD, fwd)), simt["forward"])
    if c.c_out % 8:   # the forward on tensor cores (any Cout); the backward SIMT (dy's rows are not 16-byte aligned)
        return {kind: forward if kind == "forward" else (None, simt[kind]) for kind in simt}
    s2 = c.stride ** 2
    class_pixels = c.batch * math.ceil(c.hw / c.stride) ** 2
    dgr = choose_tile(class_pixels, c.c_in, DGRAD_TILES)
    wgr = choose_tile(c.c_out, taps * c.c_in, WGRAD_TILES, min_blocks=1)
    splits = _wgrad_splits(c, wgr, gpu)
    out = {
        "forward": forward,
        "wgrad": (predict_gemm(c.c_out, taps * c.c_in, pixels_out, wgr, pipeline_bytes(wgr, True, True),
                               x_bytes + y_bytes + 2 * w_bytes * splits, kernel_name(WGRAD, wgr),  # fp32 atomics
                               k_per_block=math.ceil(pixels_out / splits / BK) * BK), simt["wgrad"]),
    }
    if not c.first:   # tap count per phase class: ceil over the classes, as the kernel runs them
        out["dgrad"] = (predict_gemm(class_pixels, c.c_in, math.ceil(c.kernel / c.stride) ** 2 * c.c_out, dgr,
                                     pipeline_bytes(dgr, False, True), x_bytes + w_bytes + y_bytes,
                                     kernel_name(DGRAD, dgr), groups_z=s2), simt["dgrad"])
    return out


def conv_shapes(blueprint, batch, hw):
    """Every convolution of ``blueprint`` at ``batch x hw x hw x 3``, in order (spatial sizes followed
    through the unfused layers: convolutions and pools change them, GAP ends them). Each runs on its input
    channels as the AMP plan pads them (to 8k: the aligned kernels, ``padded_conv``; the stem's 3 to 8)."""
    from planner import ArchPlan
    from planner.expand import align_input_channels
    arch = ArchPlan.from_blueprint(blueprint, in_channels=3, fuse=False, amp=True)
    size, shapes = {0: hw}, []
    for layer in arch.layers:
        here = size.get(layer.inputs[0], 1) if layer.inputs else hw
        if layer.kind in ("conv", "maxpool", "avgpool"):
            k, s, p = layer.param("kernel"), layer.param("stride"), layer.param("padding")
            if layer.kind == "conv":
                c_in = align_input_channels(layer.in_channels, True)
                shapes.append(ConvShape(layer.prefix or layer.path, batch, here, c_in,
                                        layer.out_channels, k, s, p, first=not shapes))
            here = (here + 2 * p - k) // s + 1
        elif layer.kind == "gap":
            here = 1
        size[layer.output] = here
    return shapes


def model_table(shapes, gpu=H200):
    """Rows ``(conv, kind, tile, mma_us, mma_tflops, simt_us, bound)`` and the totals (seconds)."""
    rows, total_mma, total_simt = [], 0.0, 0.0
    for c in shapes:
        for kind, (mma, simt) in predict_conv(c, gpu).items():
            chosen = mma or simt
            total_mma += chosen.seconds
            total_simt += simt.seconds
            rows.append((c, kind, chosen.tile, chosen.seconds * 1e6, chosen.tflops, simt.seconds * 1e6, chosen.bound))
    return rows, total_mma, total_simt


@dataclass(frozen=True)
class StepPrediction:
    """A training step's predicted time: its convolutions' GEMMs, its other kernels by their bytes, and one
    launch gap per other kernel (each GEMM's launch is in ``gemm_s``)."""
    gemm_s: float
    other_s: float
    other_launches: int
    gaps_s: float

    @property
    def seconds(self):
        return self.gemm_s + self.other_s + self.gaps_s


def predict_step(shapes, other_bytes, other_launches, gpu=H200):
    """``StepPrediction`` of a step whose convolutions are ``shapes`` and whose ``other_launches`` other kernels
    read and write ``other_bytes`` in all (from the recorded tape)."""
    _, gemm_s, _ = model_table(shapes, gpu)
    return StepPrediction(gemm_s, other_bytes / gpu.streaming_bytes_s, other_launches, other_launches * gpu.launch_s)


# PyTorch eager AMP training steps the predictions are compared with: ASSUMED, not measured here.
# ResNet-50 v1.5 b256: 2,470 img/s on one A100 80GB (NVIDIA DeepLearningExamples, PyTorch ConvNets
# README, pytorch-21.03 container, AMP) = 104 ms per step; no H200 figure is published there, so it is
# scaled by the H200/A100 ratios of HBM bandwidth (4.8 / 2.04 TB/s: 44 ms) and of the dense fp16
# tensor peak (989 / 312 TFLOP/s: 33 ms). ResNet-18-CIFAR b256: scaled from that by multiply-adds per
# image (0.56 vs 4.11 GMAC), which favours PyTorch (small images use a GPU less well).
_R50_A100_S = 256 / 2470
_R50_H200 = (_R50_A100_S / (989 / 312), _R50_A100_S / (4.8 / 2.04))
PYTORCH_EAGER_AMP_ASSUMED = {"resnet50": _R50_H200,
                             "resnet18_cifar": tuple(t * 0.557 / 4.11 for t in _R50_H200)}


def print_conv_predictions(models=None):
    """The ``--dry-run`` table: per convolution of each model, predicted mma and SIMT times."""
    from .step_common import resnet18_cifar_blueprint, zoo_model
    models = models or (("resnet50 b256 224x224", zoo_model("resnet50", 1000), 256, 224),
                        ("resnet18-cifar b512 32x32", resnet18_cifar_blueprint, 512, 32))
    print(f"\nPREDICTED convolution times on an {H200.name} (a model, not a measurement; benchmarks/gpu/model.py)")
    for label, make, batch, hw in models:
        rows, total_mma, total_simt = model_table(conv_shapes(make(), batch, hw))
        print(f"\n  {label}: {len({id(r[0]) for r in rows})} convolutions, forward + dgrad + wgrad")
        print(f"  {'conv':34s} {'pass':7s} {'tile':10s} {'mma us':>9s} {'TFLOP/s':>8s} {'simt us':>9s}  bound")
        for c, kind, tile, mma_us, tflops, simt_us, bound in rows:
            shape = f"{c.name} {c.c_in}>{c.c_out} k{c.kernel}s{c.stride} {c.hw}px"
            print(f"  {shape[:34]:34s} {kind:7s} {tile:10s} {mma_us:9.1f} {tflops:8.1f} {simt_us:9.1f}  {bound}")
        conv3 = sorted(r[4] for r in rows if r[0].kernel == 3 and r[1] == "forward" and r[2] != "simt")
        median3 = conv3[len(conv3) // 2] if conv3 else float("nan")
        print(f"  predicted total: mma {total_mma * 1e3:.1f} ms, simt {total_simt * 1e3:.1f} ms per step's "
              f"convolutions ({total_simt / total_mma:.0f}x); median 3x3 forward {median3:.0f} TFLOP/s (prediction)")
