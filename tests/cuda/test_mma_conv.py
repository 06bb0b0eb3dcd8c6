"""Tensor-core convolution and linear kernels (``_mma_*``) against the numpy spec, in the simulator.

Same conventions as test_kernels.py (fp16 inputs, float64 spec on those values, its
tolerances). Shapes are tiny: the simulator runs ~10k threads/s and every mma / ldmatrix
twin is two block barriers. The simulator tile is 32x16 (two warps); one row per kernel
also runs a GPU tile (4 warps of 32x32, two x4 B loads per k16) on a shape it covers, and the
gradients run the 128x128 tile (8 warps; its pipeline in dynamic shared memory, above 48 KB: a
launch without the byte count fails) on a few cases (~5 s per k-tile and block here). Every
other kernel of ``MMA_KERNELS`` (each tile of the planner's table, each family) runs one small
case, and the last test fails if any kernel of the table was never launched. A case whose Cin is not a multiple
of 8 runs as the planner runs it under AMP (``padded_conv``): on x and w zero-padded to 8k channels, the weight
gradient into ``dw`` of the real channels.
"""
import zlib

import numpy as np
import pytest

from planner import reference as ref
from cuda_kernels import _conv, mma_conv, mma_dgrad, mma_kernels, mma_ops, mma_wgrad
from cuda_kernels.mma_tiles import CHUNK, GPU_TILES, MmaTile
from tests.support.cuda_checks import check, dev, f64, garbage, half, replay

LAUNCHED = []   # kernel names, in launch order


def run(record):
    LAUNCHED.extend(replay(record))


def padded(a):
    """``a`` with its channels (last axis) zero-padded to a multiple of 8, as ``padded_conv`` pads x and w."""
    return np.concatenate([a, np.zeros(a.shape[:-1] + (-a.shape[-1] % CHUNK,), a.dtype)], -1)

GPU_TILE_64 = MmaTile(64, 64, 2, 2)
WIDE_TILE = GPU_TILES[0]   # 128x128, 8 warps of 64x32
# (N, H, W, Cin, Cout, k, stride, pad): partial tiles in M (pixels % 32), N (Cout % 16) and K (% 32)
FORWARD_CASES = {
    "3x3-c8-partial-mnk": (1, 5, 5, 8, 12, 3, 1, 1),     # M 25, N 12, K 72: three k-tiles, all partial edges
    "1x1-c8-k-shorter-than-stages": (2, 4, 3, 8, 16, 1, 1, 0),   # K 8: one k-tile, two empty prologue groups
    "3x3-c16-s2": (1, 7, 7, 16, 20, 3, 2, 1),            # stride 2 with padding, two column tiles
    "7x7-c24-s2-p3": (1, 6, 6, 24, 8, 7, 2, 3),          # K 1176 = 37 k-tiles; taps cross k-tiles mid-channel
    "3x3-c8-batch2-nopad": (2, 5, 4, 8, 8, 3, 1, 0),
    "7x7-c3-s2-p3-stem": (1, 8, 8, 3, 16, 7, 2, 3),      # padded to 8 channels: K 392
    "3x3-c5": (2, 4, 4, 5, 8, 3, 1, 1),
}


def _forward(rng, config, with_stats, tile=None, cases=FORWARD_CASES):
    n, h, w_, cin, cout, k, s, p = cases[config]
    x, w = half(rng, (n, h, w_, cin)), half(rng, (cout, k, k, cin), 0.5)
    y_ref = ref.conv2d_forward(f64(x), f64(w), s, p, 1)
    y = garbage(y_ref.shape, np.float16)
    sums = (garbage(cout, np.float32), garbage(cout, np.float32)) if with_stats else None
    run(lambda t: mma_conv.conv2d_forward(t, dev(padded(x)), dev(padded(w)), y, s, p, 1, bn_sums=sums, tile=tile))
    check("y", y, y_ref, "fp16")
    if with_stats:
        stored = f64(y.copy_to_host()).reshape(-1, cout)
        check("sum", sums[0], stored.sum(0), "stats")
        check("sum of squares", sums[1], (stored ** 2).sum(0), "stats")


@pytest.mark.parametrize("config", sorted(FORWARD_CASES))
@pytest.mark.parametrize("with_stats", [False, True], ids=["plain", "bn-stats"])
def test_forward_matches_reference(request, config, with_stats):
    _forward(np.random.default_rng(zlib.crc32(request.node.name.encode())), config, with_stats)


def test_forward_on_a_gpu_tile():
    _forward(np.random.default_rng(3), "3x3-c8-partial-mnk", True, tile=GPU_TILE_64)


def test_the_forward_takes_channels_multiples_of_8_and_groups_1():
    """Cin % 8 != 0 runs SIMT unless padded (``padded_conv``): no any-channel kernel is left."""
    assert mma_conv.mma_supported((1, 4, 4, 8), (8, 3, 3, 8), 1)
    assert not mma_conv.mma_supported((1, 4, 4, 3), (8, 3, 3, 3), 1)
    assert not mma_conv.mma_supported((1, 4, 4, 8), (8, 3, 3, 4), 2)
    assert not any("any_channels" in name for name in mma_kernels.all_mma_kernels())


# ---- weight gradient ------------------------------------------------------------------------------------------
WGRAD_CASES = {  # (N, H, W, Cin, Cout, k, stride, pad)
    "3x3-c8-cout16": (1, 5, 5, 8, 16, 3, 1, 1),          # 25 pixels: one partial k-tile; N = 72 partial
    "1x1-c16-cout40-s2": (2, 7, 7, 16, 40, 1, 2, 0),     # Cout 40: partial M tile; 32 pixels
    "3x3-c24-s2-split": (2, 9, 9, 24, 8, 3, 2, 1),       # 50 pixels over 2 splits, partial last k-tile
    "7x7-c8-s2-p3": (1, 8, 8, 8, 8, 7, 2, 3),
    "7x7-c3-s2-p3-stem": (1, 8, 8, 3, 16, 7, 2, 3),     # padded to 8: N = 392, dw's 147 real columns
    "3x3-c5-split": (2, 6, 6, 5, 8, 3, 1, 1),           # 72 pixels over 2 splits; padded to 8
}


def _wgrad(rng, config, tile=None, cases=WGRAD_CASES):
    n, h, w_, cin, cout, k, s, p = cases[config]
    x, w = half(rng, (n, h, w_, cin)), half(rng, (cout, k, k, cin), 0.5)
    y_shape = ref.conv2d_forward(f64(x), f64(w), s, p, 1).shape
    dy = half(rng, y_shape)
    dw = garbage(w.shape, np.float32)   # the real channels (of a padded x and w: the real columns only)
    run(lambda t: mma_wgrad.conv2d_backward_weight(t, dev(padded(x)), dev(padded(w)), dev(dy), dw, s, p, tile=tile))
    _, dw_ref = ref.conv2d_backward(f64(x), f64(w), f64(dy), s, p, 1)
    check("dw", dw, dw_ref, "fp32")


@pytest.mark.parametrize("config", sorted(WGRAD_CASES))
def test_wgrad_matches_reference(request, config):
    _wgrad(np.random.default_rng(zlib.crc32(request.node.name.encode())), config)


def test_wgrad_on_a_gpu_tile():
    _wgrad(np.random.default_rng(4), "3x3-c8-cout16", tile=GPU_TILE_64)


WIDE_WGRAD_CASES = {  # (N, H, W, Cin, Cout, k, stride, pad)
    "1x1-81-pixels": (1, 9, 9, 8, 8, 1, 1, 0),     # three k-tiles of pixels, the last partial; M 8, N 8
    "3x3-s2-c8": (1, 5, 5, 8, 16, 3, 2, 1),        # 9 pixels: one k-tile, shorter than the pipeline; N 72
    "3x3-s2-c3-stem": (1, 4, 4, 3, 8, 3, 2, 1),    # padded to 8: N 72, dw's 27 real columns
}


@pytest.mark.parametrize("config", sorted(WIDE_WGRAD_CASES))
def test_wgrad_on_the_wide_tile(config):
    _wgrad(np.random.default_rng(13), config, tile=WIDE_TILE, cases=WIDE_WGRAD_CASES)


# ---- input gradient ---------------------------------------------------------------------------------------------
DGRAD_CASES = {  # (N, H, W, Cin, Cout, k, stride, pad, accumulate)
    "3x3-s1-p1": (1, 5, 6, 8, 16, 3, 1, 1, False),           # 30 pixels: partial M, K 144
    "3x3-s2-p1-accumulate": (2, 7, 6, 16, 8, 3, 2, 1, True),  # four phase classes of unequal size
    "1x1-s2": (1, 5, 5, 24, 8, 1, 2, 0, False),               # three classes no tap reaches: zeros
    "7x7-s2-p3-c8": (1, 8, 7, 8, 8, 7, 2, 3, False),          # 12-16 taps per class, partial k-tiles
    "3x3-s1-p1-co48": (1, 4, 5, 8, 48, 3, 1, 1, False),      # 48 dy channels: a k-tile's step wraps inside a tap
    # 15 filter rows, 8 dy channels: 4 taps a k-tile; the two k-tiles issued past the end move the row bit of the
    # tap (bit 16 + ty) off its word (ty >= 16), where only the check of the reduction's end keeps the copies invalid
    "15x1-taps-past-the-word": (1, 16, 2, 8, 8, (15, 1), 1, 0, False),
}


def _dgrad(rng, config, tile=None, cases=DGRAD_CASES):
    n, h, w_, cin, cout, k, s, p, accumulate = cases[config]
    kh, kw = k if isinstance(k, tuple) else (k, k)
    x, w = half(rng, (n, h, w_, cin)), half(rng, (cout, kh, kw, cin), 0.5)
    dy = half(rng, ref.conv2d_forward(f64(x), f64(w), s, p, 1).shape)
    dx0 = half(rng, x.shape)
    dx = dev(dx0) if accumulate else garbage(x.shape, np.float16)
    run(lambda t: mma_dgrad.conv2d_backward_data(t, dev(w), dev(dy), dx, s, p, accumulate, tile=tile))
    dx_ref, _ = ref.conv2d_backward(f64(x), f64(w), f64(dy), s, p, 1)
    check("dx", dx, dx_ref + (f64(dx0) if accumulate else 0), "fp16")


@pytest.mark.parametrize("config", sorted(DGRAD_CASES))
def test_dgrad_matches_reference(request, config):
    _dgrad(np.random.default_rng(zlib.crc32(request.node.name.encode())), config)


def test_dgrad_on_a_gpu_tile():
    _dgrad(np.random.default_rng(5), "3x3-s2-p1-accumulate", tile=GPU_TILE_64)


WIDE_DGRAD_CASES = {  # (N, H, W, Cin, Cout, k, stride, pad, accumulate)
    "3x3-s1-k72": (1, 4, 4, 16, 8, 3, 1, 1, False),         # K 72: three k-tiles, the last partial; M 16, N 16
    "3x3-s2-accumulate": (1, 4, 4, 16, 8, 3, 2, 1, True),   # four phase classes, each K <= 32: one k-tile
}


@pytest.mark.parametrize("config", sorted(WIDE_DGRAD_CASES))
def test_dgrad_on_the_wide_tile(config):
    _dgrad(np.random.default_rng(12), config, tile=WIDE_TILE, cases=WIDE_DGRAD_CASES)


# ---- fully connected (GapFc's fc too): the same engine through mma_ops ---------------------------------------
LINEAR_CASES = {  # (batch, in, out, bias, accumulate)
    "bias": (5, 16, 24, True, False),              # partial M (5 rows) and N (24 of 32)
    "no-bias-accumulate": (3, 40, 8, False, True),
}


@pytest.mark.parametrize("config", sorted(LINEAR_CASES))
def test_linear_matches_reference(request, config):
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))
    n, f_in, f_out, with_bias, accumulate = LINEAR_CASES[config]
    x, w, dy, dx0 = half(rng, (n, f_in)), half(rng, (f_out, f_in), 0.5), half(rng, (n, f_out)), half(rng, (n, f_in))
    b = rng.standard_normal(f_out).astype(np.float32) if with_bias else None
    y, dw, db = garbage((n, f_out), np.float16), garbage(w.shape, np.float32), garbage(f_out, np.float32)
    dx = dev(dx0) if accumulate else garbage(x.shape, np.float16)
    ops = mma_ops.gemm_kernels("mma")

    def record(t):
        ops.linear_forward(t, dev(x), dev(w), None if b is None else dev(b), y)
        ops.linear_backward(t, dev(x), dev(w), dev(dy), dx, dw, db, accumulate)
    run(record)
    check("y", y, ref.linear_forward(f64(x), f64(w), None if b is None else f64(b)), "fp16")
    dx_ref, dw_ref, db_ref = ref.linear_backward(f64(x), f64(w), f64(dy))
    check("dx", dx, dx_ref + (f64(dx0) if accumulate else 0), "fp16")
    check("dw", dw, dw_ref, "fp32")
    check("db", db, db_ref, "fp32")
    assert any(name.startswith("mma_") for name in LAUNCHED), "the tensor-core kernels did not run"


def test_gemm_kernels_names_its_choices():
    assert mma_ops.gemm_kernels("simt").conv2d_forward is _conv.conv2d_forward
    with pytest.raises(ValueError, match="expected one of \\['mma', 'simt'\\], got 'wmma'"):
        mma_ops.gemm_kernels("wmma")


# ---- every GPU tile of the planner's table, every kernel family: one small case each ------------------------------
# The cases above run the simulator tile everywhere, 64x64 and 128x128 on a few; these launch each remaining kernel
# of MMA_KERNELS once (its tile's loads, warp layout and epilogue), on shapes with partial tiles in M and N and a
# reduction of one or two k-tiles (the pipeline shorter than its stages). 1-18 s each here (2 shared cores).
def _tile_cases(tile):
    """Per kernel family: how to run it on ``tile`` (Cout / Cin ``tile.bn - 8``: a partial column tile)."""
    c = max(CHUNK, tile.bn - CHUNK)
    forward = {"plain-1x1-s2-k24": (1, 6, 6, 24, c, 1, 2, 0), "stats-1x1-k40": (1, 5, 5, 40, c, 1, 1, 0)}
    wgrad = {"1x1-25-pixels": (1, 5, 5, c, 16, 1, 1, 0)}
    dgrad = {"3x3-s2-accumulate": (1, 5, 5, c, CHUNK, 3, 2, 1, True)}
    return {
        "conv2d_forward": lambda rng: _forward(rng, "plain-1x1-s2-k24", False, tile, forward),
        "conv2d_forward_bn_stats": lambda rng: _forward(rng, "stats-1x1-k40", True, tile, forward),
        "linear_forward_bias": lambda rng: _linear_bias(rng, (5, 24, c), tile),
        "conv2d_backward_weight": lambda rng: _wgrad(rng, "1x1-25-pixels", tile, wgrad),
        "conv2d_backward_data": lambda rng: _dgrad(rng, "3x3-s2-accumulate", tile, dgrad),
    }


# launched by the GPU-tile and wide-tile tests above
COVERED_ABOVE = {f"mma_{family}_{tile.name}" for tile in (GPU_TILE_64, WIDE_TILE)
                 for family in ("conv2d_backward_weight", "conv2d_backward_data")} | {
    f"mma_conv2d_forward_bn_stats_{GPU_TILE_64.name}"}
GPU_TILE_KERNELS = sorted((name, tile) for name in mma_kernels.all_mma_kernels() for tile in GPU_TILES
                          if name.endswith("_" + tile.name) and name not in COVERED_ABOVE)


def _linear_bias(rng, shape, tile):
    n, f_in, f_out = shape
    x, w, b = half(rng, (n, f_in)), half(rng, (f_out, f_in), 0.5), rng.standard_normal(f_out).astype(np.float32)
    y = garbage((n, f_out), np.float16)
    run(lambda t: mma_ops.linear_forward(t, dev(x), dev(w), dev(b), y, tile=tile))
    check("y", y, ref.linear_forward(f64(x), f64(w), f64(b)), "fp16")


@pytest.mark.parametrize("name, tile", GPU_TILE_KERNELS, ids=[name for name, _ in GPU_TILE_KERNELS])
def test_every_gpu_tile_kernel_matches_reference(name, tile):
    family = name[len("mma_"):-len("_" + tile.name)]
    before = len(LAUNCHED)
    _tile_cases(tile)[family](np.random.default_rng(zlib.crc32(name.encode())))
    assert name in LAUNCHED[before:], f"{name} was not launched; the case ran {LAUNCHED[before:]}"


def test_every_tensor_core_kernel_is_launched():
    """Runs last (file order): every kernel of MMA_KERNELS (every tile of the table, every family) must have been
    launched by a case above."""
    every = set(mma_kernels.all_mma_kernels())
    if not LAUNCHED:
        pytest.skip("coverage is only known when the cases above ran")
    assert every <= set(LAUNCHED), f"never launched: {sorted(every - set(LAUNCHED))}"
