"""A performance model of the GEMM kernels on an H200: PREDICTIONS, never measurements.

Per GEMM (forward, input gradient, weight gradient of each convolution) with the tile
``choose_tile`` picks: blocks per SM from registers / shared memory / threads; per k-tile and
SM the time of its mma (tensor-core issue rate) and of its shared-memory traffic (ldmatrix
reads + cp.async writes, 128 B/clock); waves of 132 SMs (quantisation); HBM bytes (every
operand once) and L2 bytes (A once per column of tiles, B once per row); the time is the
largest of the three plus a launch (the any-channel forward of stems adds the issue time of
its scalar staging). SIMT: issue-bound, 4 instructions per FFMA (its SASS,
CUDA-NOTES.md) at 20% of the issue slots, calibrated to issue 12's 2-3.5 TFLOP/s estimate;
its input gradient gathers with s^2 the work. The H200 figures are the datasheet's; the
mma.sync share of the tensor-core peak is an assumption (wgmma reaches the peak on Hopper).
``gpu_check.py`` prints measured beside predicted on a GPU, which tells model from kernel.
"""
import math
from dataclasses import dataclass

from cuda_kernels.mma_dgrad import DGRAD_TILES
from cuda_kernels.mma_conv import STEM_TILES
from cuda_kernels.mma_tiles import BK, CHUNK, choose_tile, pipeline_bytes
from cuda_kernels.mma_wgrad import WGRAD_TILES


@dataclass(frozen=True)
class Gpu:
    name: str = "H200 SXM"
    sms: int = 132
    clock_hz: float = 1.98e9
    tensor_fp16_flops: float = 989e12     # dense fp16 in, fp32 accumulate (datasheet)
    mma_sync_share: float = 0.65          # assumption: mma.sync vs wgmma on Hopper
    smem_bytes_per_clock: int = 128       # per SM
    shared_per_sm: int = 228 * 1024
    registers_per_sm: int = 65536
    hbm_bytes_s: float = 4.8e12
    l2_bytes_s: float = 10e12             # assumption
    launch_s: float = 2e-6                # graph-replayed kernel
    simt_issue_share: float = 0.20        # SIMT calibration (see the module docstring)


H200 = Gpu()
# registers per thread of each tile's kernels, an upper bound (ptxas -v, sm_80 and sm_90): the design budget
DESIGN_REGISTERS = {256: 200, 128: 216, 64: 64}


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


# the any-channel forward (stems) stages 8 scalar loads per 16-byte chunk: ~12 issued instructions each
SCALAR_STAGING_INSTRUCTIONS = 12 * CHUNK


def predict_gemm(m, n, k, tile, shared_bytes, hbm_bytes, groups_z=1, k_per_block=None, scalar_staging=False,
                 gpu=H200):
    """Predicted time of one tensor-core GEMM launch: ``groups_z`` independent GEMMs of m x n x k
    (implicit operands: ``hbm_bytes`` is what the tensors themselves hold; L2 serves the re-reads)."""
    flops = 2.0 * m * n * k * groups_z
    k_per_block = k_per_block or k
    splits = math.ceil(k / k_per_block)
    blocks = math.ceil(m / tile.bm) * math.ceil(n / tile.bn) * splits * groups_z
    resident = blocks_per_sm(tile, shared_bytes, gpu)
    sm_rate = gpu.tensor_fp16_flops * gpu.mma_sync_share / gpu.sms
    t_mma = resident * 2.0 * tile.bm * tile.bn * BK / sm_rate
    warps = tile.threads // 32
    smem = warps * (tile.mi * 16 + tile.ni * 8) * BK * 2 + (tile.bm + tile.bn) * BK * 2
    t_smem = resident * smem / (gpu.smem_bytes_per_clock * gpu.clock_hz)
    chunks = (tile.bm + tile.bn) * BK // CHUNK   # 16-byte chunks staged per k-tile and block
    t_issue = resident * chunks / 32 * SCALAR_STAGING_INSTRUCTIONS / (4 * gpu.clock_hz) if scalar_staging else 0.0
    waves = math.ceil(blocks / (gpu.sms * resident))
    t_compute = waves * math.ceil(k_per_block / BK) * max(t_mma, t_smem, t_issue)
    t_hbm = hbm_bytes / gpu.hbm_bytes_s
    t_l2 = 2.0 * groups_z * (m * k * math.ceil(n / tile.bn) + k * n * math.ceil(m / tile.bm)) / gpu.l2_bytes_s
    unit = max((t_mma, "tensor cores"), (t_smem, "shared memory"), (t_issue, "scalar staging"))[1]
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


def predict_conv(c, gpu=H200):
    """``{"forward" | "dgrad" | "wgrad": (mma Prediction or None, simt Prediction)}`` of one convolution."""
    pixels_out, taps = c.batch * c.out_hw ** 2, c.kernel ** 2
    flops = 2.0 * pixels_out * c.c_out * taps * c.c_in
    simt = {"forward": predict_simt(flops), "dgrad": predict_simt(flops * c.stride ** 2),
            "wgrad": predict_simt(flops)}
    if c.first:
        del simt["dgrad"]
    x_bytes, w_bytes, y_bytes = 2.0 * c.batch * c.hw ** 2 * c.c_in, 2.0 * taps * c.c_in * c.c_out, 2.0 * pixels_out * c.c_out
    if c.c_in % 8 or c.c_out % 8:   # stems: any-channel forward and weight gradient; no input gradient
        out = {kind: (None, simt[kind]) for kind in simt}
        stem = choose_tile(pixels_out, c.c_out, STEM_TILES)
        out["forward"] = (predict_gemm(pixels_out, c.c_out, taps * c.c_in, stem, pipeline_bytes(stem, False, False),
                                       x_bytes + w_bytes + y_bytes, scalar_staging=True), simt["forward"])
        if c.c_out % 8 == 0 and c.first:
            wgr = choose_tile(c.c_out, taps * c.c_in, WGRAD_TILES, min_blocks=1)
            splits = _wgrad_splits(c, wgr, gpu)
            out["wgrad"] = (predict_gemm(c.c_out, taps * c.c_in, pixels_out, wgr, pipeline_bytes(wgr, True, True),
                                         x_bytes + y_bytes + 2 * w_bytes * splits, scalar_staging=True,
                                         k_per_block=math.ceil(pixels_out / splits / BK) * BK), simt["wgrad"])
        return out
    fwd = choose_tile(pixels_out, c.c_out)
    s2 = c.stride ** 2
    class_pixels = c.batch * math.ceil(c.hw / c.stride) ** 2
    dgr = choose_tile(class_pixels, c.c_in, DGRAD_TILES)
    wgr = choose_tile(c.c_out, taps * c.c_in, WGRAD_TILES, min_blocks=1)
    splits = _wgrad_splits(c, wgr, gpu)
    out = {
        "forward": (predict_gemm(pixels_out, c.c_out, taps * c.c_in, fwd, pipeline_bytes(fwd, False, False),
                                 x_bytes + w_bytes + y_bytes), simt["forward"]),
        "wgrad": (predict_gemm(c.c_out, taps * c.c_in, pixels_out, wgr, pipeline_bytes(wgr, True, True),
                               x_bytes + y_bytes + 2 * w_bytes * splits,   # fp32 atomics per split
                               k_per_block=math.ceil(pixels_out / splits / BK) * BK), simt["wgrad"]),
    }
    if not c.first:   # tap count per phase class: ceil over the classes, as the kernel runs them
        out["dgrad"] = (predict_gemm(class_pixels, c.c_in, math.ceil(c.kernel / c.stride) ** 2 * c.c_out, dgr,
                                     pipeline_bytes(dgr, False, True),
                                     x_bytes + w_bytes + y_bytes, groups_z=s2), simt["dgrad"])
    return out


def conv_shapes(blueprint, batch, hw):
    """Every convolution of ``blueprint`` at ``batch x hw x hw x 3``, in order (spatial sizes followed
    through the unfused layers: convolutions and pools change them, GAP ends them)."""
    from planner import ArchPlan
    arch = ArchPlan.from_blueprint(blueprint, in_channels=3, fuse=False, amp=True)
    size, shapes = {0: hw}, []
    for layer in arch.layers:
        here = size.get(layer.inputs[0], 1) if layer.inputs else hw
        if layer.kind in ("conv", "maxpool", "avgpool"):
            k, s, p = layer.param("kernel"), layer.param("stride"), layer.param("padding")
            if layer.kind == "conv":
                shapes.append(ConvShape(layer.prefix or layer.path, batch, here, layer.in_channels,
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
