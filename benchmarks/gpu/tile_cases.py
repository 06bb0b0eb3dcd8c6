"""Every GPU tile x {forward, dgrad, wgrad}, checked on the device before anything is timed with it.

Each case is a 3x3 convolution (stride 1, pad 1) sized so that its launch has at least 2 blocks in each
grid dimension it has (pixels or filters, columns; a partial last block in each) and a reduction of 5
k-tiles (K = 144 = 9 x 16 taps x channels, or 144 pixels: the 3-stage cp.async ring wraps, the last
k-tile partial). Inputs are fresh random fp16, the output is poisoned with NaN before the launch, and
the result is compared with the float64 numpy spec at the kernel tests' tolerances. A case that fails
(or crashes its process) excludes its (direction, tile) from the timed units: ``excluded_tiles`` gives
the ``BLUEPRINT_MMA_EXCLUDE`` value those units run with (the executor runs that GEMM SIMT)."""
import math
from dataclasses import dataclass

from cuda_kernels.mma_dgrad import DGRAD_TILES
from cuda_kernels.mma_tiles import BK, GPU_TILES, MmaTile
from cuda_kernels.mma_wgrad import WGRAD_TILES
from cuda_kernels.tile_exclusions import format_exclusions

K_TILES = 5
CHANNELS_FOR_K = 16       # 3x3 taps x 16 channels = 144 = 4.5 k-tiles of 32: 5, the last partial
DIRECTION_TILES = {"forward": GPU_TILES, "dgrad": tuple(t for t in DGRAD_TILES if t in GPU_TILES),
                   "wgrad": tuple(t for t in WGRAD_TILES if t in GPU_TILES)}


@dataclass(frozen=True)
class TileCase:
    direction: str
    tile: MmaTile
    shape: tuple          # (N, H, W, Cin, Cout, k, stride, pad)

    @property
    def name(self):
        return f"{self.direction}:{self.tile.name}"

    @property
    def gemm(self):
        """``(M, N, K)`` of the case's GEMM, as the direction's kernel sees it (stride 1: one dgrad class)."""
        n, h, w, c_in, c_out, k, _, _ = self.shape
        pixels, taps = n * h * w, k * k
        return {"forward": (pixels, c_out, taps * c_in), "dgrad": (pixels, c_in, taps * c_out),
                "wgrad": (c_out, taps * c_in, pixels)}[self.direction]

    @property
    def blocks(self):
        m, n, _ = self.gemm
        return math.ceil(m / self.tile.bm), math.ceil(n / self.tile.bn)

    @property
    def k_tiles(self):
        return math.ceil(self.gemm[2] / BK)


def _case(direction, tile):
    side = math.isqrt(tile.bm) + 1                          # side * side > bm pixels: 2 row blocks
    if direction == "forward":
        return TileCase(direction, tile, (1, side, side, CHANNELS_FOR_K, tile.bn + 8, 3, 1, 1))
    if direction == "dgrad":
        return TileCase(direction, tile, (1, side, side, tile.bn + 8, CHANNELS_FOR_K, 3, 1, 1))
    c_in = max(8, math.ceil((tile.bn + 1) / 9 / 8) * 8)   # 9 * c_in > bn columns: 2 column blocks
    return TileCase(direction, tile, (1, 12, 12, c_in, tile.bm + 8, 3, 1, 1))   # 144 pixels: 5 k-tiles


CASES = {c.name: c for c in (_case(d, t) for d, tiles in DIRECTION_TILES.items() for t in tiles)}


def excluded_tiles(results):
    """The ``BLUEPRINT_MMA_EXCLUDE`` value of ``{case name: status}``: every case not "ok"."""
    return format_exclusions({tuple(name.split(":")) for name, status in results.items() if status != "ok"})


def run_case(name, seed=0):
    """Run one case on the current device (or the simulator); ``{"ok", "max_error", "kernel", ...}``."""
    import numpy as np
    from numba import cuda

    from cuda_kernels import graph, mma_conv, mma_dgrad, mma_wgrad
    from cuda_kernels.tape import LaunchTape
    from planner import reference as ref
    from tests.support.cuda_checks import TOLERANCES

    case = CASES[name]
    n, h, w_, c_in, c_out, k, s, p = case.shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, h, w_, c_in)).astype(np.float16)
    w = (rng.standard_normal((c_out, k, k, c_in)) * 0.5).astype(np.float16)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    dy = rng.standard_normal(ref.conv2d_forward(x64, w64, s, p, 1).shape).astype(np.float16)
    if case.direction == "forward":
        expected, dtype, tol = ref.conv2d_forward(x64, w64, s, p, 1), np.float16, "fp16"
    else:
        dx_ref, dw_ref = ref.conv2d_backward(x64, w64, dy.astype(np.float64), s, p, 1)
        expected, dtype, tol = (dx_ref, np.float16, "fp16") if case.direction == "dgrad" else (dw_ref, np.float32,
                                                                                              "fp32")
    dx, dw, ddy = cuda.to_device(x), cuda.to_device(w), cuda.to_device(dy)
    out = cuda.to_device(np.full(expected.shape, np.nan, dtype))
    cuda.synchronize()   # the copies (legacy stream) before the launch (the unit's own stream)
    launch = {"forward": lambda t: mma_conv.conv2d_forward(t, dx, dw, out, s, p, 1, tile=case.tile),
              "dgrad": lambda t: mma_dgrad.conv2d_backward_data(t, dw, ddy, out, s, p, False, tile=case.tile),
              "wgrad": lambda t: mma_wgrad.conv2d_backward_weight(t, dx, dw, ddy, out, s, p, tile=case.tile)}
    tape = LaunchTape()
    launch[case.direction](tape)
    stream = graph.new_stream()
    tape.compile_kernels()
    tape.replay(stream)
    graph.synchronize(stream)
    got = out.copy_to_host().astype(np.float64)
    rtol, atol_fraction = TOLERANCES[tol]
    atol = atol_fraction * float(np.abs(expected).max(initial=0.0))
    bad = ~np.isfinite(got) | (np.abs(got - expected) > atol + rtol * np.abs(expected))
    error = float(np.nanmax(np.abs(got - expected))) if np.isfinite(got).any() else math.inf
    result = {"ok": not bad.any(), "kernel": tape.names()[-1], "shape": list(case.shape),
              "blocks": list(case.blocks), "k_tiles": case.k_tiles, "max_error": error,
              "unwritten_or_wrong": int(bad.sum())}
    if bad.any():
        result["error"] = (f"{name}: {int(bad.sum())} of {bad.size} outputs unwritten (NaN) or outside rtol {rtol}, "
                           f"atol {atol:.2e}; max |error| {error:.3e}")
    return result
