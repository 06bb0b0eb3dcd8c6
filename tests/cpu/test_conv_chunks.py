"""The general convolution's chunks: how many im2col rows each GEMM takes (L2-sized, or cut to
fit OpenBLAS's unpacked small-matrix kernels where the BLAS has them), and that both rules give
the numpy reference's results with several chunks per worker, grouped and strided included."""
import numpy as np
import pytest

from cpu_ref import _conv, _misc
from cpu_ref import kernels as K
from planner import reference as R

F32 = np.float32
TOL = 1e-4   # tests/cpu/test_kernels.py's tolerance for the same kernels, fp32 against float64

CHUNK_ROWS = [
    # (rows per worker, KD, Cout per group, OpenBLAS core, (rows per chunk, small-matrix kernels))
    (65536, 144, 16, "skylakex", (434, True)),        # 16 channels 3x3: 1e6 // (144*16) multiply-adds
    (65536, 144, 16, "haswell", (910, False)),        # no small-matrix kernels: L2-sized, 2**19 // (4*144)
    (65536, 144, 16, None, (910, False)),             # core unknown: L2-sized
    (32768, 288, 32, "sapphirerapids", (108, True)),  # 32 channels 3x3
    (32768, 288, 32, "zen", (512, False)),           # 455 L2-sized rows, raised to MIN_GEMM_ROWS
    (8192, 576, 64, "skylakex", (512, False)),        # 64 channels 3x3: 27 rows, under the floor: 227 L2-sized
                                                      # rows, raised to MIN_GEMM_ROWS
    (8192, 4608, 512, "haswell", (512, False)),       # 512 channels 3x3: 28 L2-sized rows, raised to MIN_GEMM_ROWS
    (300, 4608, 512, "haswell", (300, False)),        # ... but never more rows than the worker has
    (100, 144, 16, "cooperlake", (100, True)),        # fewer rows than either bound: all of them
]


@pytest.mark.parametrize("rows, kd, kg, core, expected", CHUNK_ROWS)
def test_chunk_rows(rows, kd, kg, core, expected, monkeypatch):
    monkeypatch.setattr(_conv, "BLAS_CORE", core)
    assert _conv._gemm_chunk_rows(rows, kd, kg) == expected


# (N, H, W, Cin, Cout, K, stride, pad, groups): every one runs the general (im2col) algorithm
CONVS = [
    (3, 9, 9, 8, 8, 3, 1, 1, 1),
    (4, 13, 12, 8, 12, 3, 2, 1, 1),
    (3, 9, 9, 16, 16, 3, 1, 1, 2),
    (4, 10, 10, 12, 9, 3, 1, 1, 3),
]
#: Shrunk bounds so that these small convolutions take several chunks per worker under either
#: rule (e.g. the first: 34 rows per chunk where small-matrix kernels exist, 50 elsewhere).
SMALL_MACS, CHUNK_BYTES, MIN_SMALL_ROWS, MIN_ROWS = 20_000, 4 * 72 * 50, 16, 1


def _run(conv, accumulate):
    n, h, w, cin, cout, k, s, p, g = conv
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, h, w, cin)).astype(F32)
    wt = rng.standard_normal((cout, k, k, cin // g)).astype(F32)
    oh, ow = R.conv_output_size(h, k, s, p), R.conv_output_size(w, k, s, p)
    dy = rng.standard_normal((n, oh, ow, cout)).astype(F32)
    col = np.full(n * oh * ow * k * k * (cin // g), np.nan, F32)
    y = np.full((n, oh, ow, cout), np.nan, F32)
    K.conv2d_forward(x, wt, y, s, p, g, col)
    start = rng.standard_normal(x.shape).astype(F32)
    dx = start.copy() if accumulate else np.full(x.shape, np.nan, F32)
    dw = np.full(wt.shape, np.nan, F32)
    K.conv2d_backward(x, wt, dy, dx, dw, s, p, g, col, accumulate)
    x64, w64 = x.astype(np.float64), wt.astype(np.float64)
    want_dx, want_dw = R.conv2d_backward(x64, w64, dy.astype(np.float64), s, p, g)
    return {"y": (y, R.conv2d_forward(x64, w64, s, p, g)),
            "dx": (dx, want_dx + (start if accumulate else 0.0)), "dw": (dw, want_dw)}


@pytest.mark.parametrize("accumulate", [False, True], ids=["overwrite", "accumulate"])
@pytest.mark.parametrize("core", ["skylakex", "haswell"])
@pytest.mark.parametrize("conv", CONVS, ids=lambda c: "n{}_{}x{}_{}to{}_k{}s{}p{}g{}".format(*c))
@pytest.mark.parametrize("pool", ["calling_thread", "thread_pool"])
def test_chunked_conv_matches_reference(conv, core, accumulate, pool, monkeypatch):
    monkeypatch.setattr(_conv, "BLAS_CORE", core)
    monkeypatch.setattr(_conv, "SMALL_GEMM_MACS", SMALL_MACS)
    monkeypatch.setattr(_conv, "COL_CHUNK_BYTES", CHUNK_BYTES)
    monkeypatch.setattr(_conv, "MIN_SMALL_GEMM_ROWS", MIN_SMALL_ROWS)
    monkeypatch.setattr(_conv, "MIN_GEMM_ROWS", MIN_ROWS)
    if pool == "thread_pool":
        monkeypatch.setattr(_misc, "PARALLEL_MIN_ELEMENTS", 1)
    n, h, w, cin, cout, k, s, p, g = conv
    rows = n * R.conv_output_size(h, k, s, p) * R.conv_output_size(w, k, s, p)
    chunk, _ = _conv._gemm_chunk_rows(rows // _misc.partitions(rows), k * k * cin // g, cout // g)
    assert chunk < rows // _misc.partitions(rows), "the bounds no longer split this convolution into chunks"
    for name, (got, want) in _run(conv, accumulate).items():
        np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL * max(1.0, float(np.abs(want).max())),
                                   err_msg=f"{conv} {name} ({core} chunks)")
