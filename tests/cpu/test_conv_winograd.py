"""The Winograd forward and input gradient (`cpu_ref._conv_winograd`) against the float64 reference: odd and even
image sizes (the last tile cut off), images smaller than a tile, channel counts that fill no vector, several
samples, the input gradient overwritten and added into; chunks of one band to all of a partition's, one to three
partitions, serially and on the thread pool (the same bits); the weight transform against ``G g G^T`` in float64;
the rule that sends a layer there and the kernels' refusal of a shape they cannot compute."""
import threading

import numpy as np
import pytest

from cpu_ref import _conv as C
from cpu_ref import _conv_winograd as WG
from cpu_ref import kernels as K
from cpu_ref._epilogue import NONE
from cpu_ref._workspace import workspace
from planner import reference as R
from planner.conv_algorithm import ConvAlgorithms, conv_algorithms, winograd_pays

F32 = np.float32
TOL = 1e-5   # as the direct kernels' (tests/cpu/test_conv_direct.py): fp32 sums of at most 3*3*64 products
WINOGRAD = ConvAlgorithms("winograd", "winograd", "gemm")

CASES = [
    # n, h, w, cin, cout
    (2, 7, 9, 16, 8),      # odd height and width: the last row and column of tiles are cut off
    (1, 6, 6, 64, 64),     # even: whole tiles
    (3, 5, 2, 3, 5),       # channels that fill no 8-float vector; an image one tile wide
    (1, 1, 1, 8, 8),       # one pixel: a tile with one output and 3 of its 4 input rows and columns padding
    (2, 2, 3, 24, 40),
    (1, 14, 14, 256, 64),  # more input than output channels (a chunk of one band with small-matrix kernels)
]


def _inputs(n, h, w, cin, cout, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, h, w, cin)).astype(F32), rng.standard_normal((cout, 3, 3, cin)).astype(F32)


def _reference(x, wt):
    return R.conv2d_forward(x.astype(np.float64), wt.astype(np.float64), 1, 1, 1)


def _assert_close(y, want):
    np.testing.assert_allclose(y, want, rtol=TOL, atol=TOL * float(np.abs(want).max()))


@pytest.mark.parametrize("n,h,w,cin,cout", CASES)
def test_the_winograd_forward_matches_the_reference(n, h, w, cin, cout):
    x, wt = _inputs(n, h, w, cin, cout)
    y = np.full((n, h, w, cout), np.nan, F32)   # every element must be written
    K.conv2d_forward(x, wt, y, 1, 1, 1, None, WINOGRAD)
    _assert_close(y, _reference(x, wt))


@pytest.mark.parametrize("n,h,w,cin,cout", CASES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_the_winograd_input_gradient_matches_the_reference(n, h, w, cin, cout, accumulate):
    x, wt = _inputs(n, h, w, cin, cout)
    dy = np.random.default_rng(3).standard_normal((n, h, w, cout)).astype(F32)
    want_dx, want_dw = R.conv2d_backward(x.astype(np.float64), wt.astype(np.float64), dy.astype(np.float64), 1, 1, 1)
    before = np.random.default_rng(4).standard_normal(x.shape).astype(F32)
    dx = before.copy() if accumulate else np.full(x.shape, np.nan, F32)
    dw = np.full(wt.shape, np.nan, F32)
    col = np.empty(n * h * w * 9 * cin, F32)
    K.conv2d_backward(x, wt, dy, dx, dw, 1, 1, 1, col, accumulate, WINOGRAD)
    if accumulate:
        want_dx = want_dx + before
    _assert_close(dx, want_dx)
    _assert_close(dw, want_dw)   # from an im2col + GEMM pass of its own


@pytest.mark.parametrize("row,col", [(0, 0), (2, 3), (3, 0), (6, 8)])
def test_a_non_finite_input_reaches_only_the_outputs_of_its_window(row, col):
    """Outputs whose 3x3 window misses the infinite input stay finite (the tile's other pixels included); those
    it reaches are non-finite (NaN where the direct sum gives an infinity: the transforms subtract it)."""
    x, wt = _inputs(1, 7, 9, 8, 8)
    x[0, row, col, 3] = np.inf
    y = np.empty((1, 7, 9, 8), F32)
    K.conv2d_forward(x, wt, y, 1, 1, 1, None, WINOGRAD)
    reached = ~np.isfinite(_reference(x, wt))
    assert reached.any() and not reached.all()
    assert np.array_equal(~np.isfinite(y), reached)


def _run(x, wt, bands, nparts, pooled):
    n, h, w, cin = x.shape
    cout = wt.shape[0]
    tiles = bands * ((w + 1) // 2)
    u = WG.weight_transform(wt)
    v = np.empty((nparts, WG.POINTS, tiles, cin), F32)
    m = np.empty((nparts, WG.POINTS, tiles, cout), F32)
    r = np.empty((nparts, WG.POINTS, max(cin, cout)), F32)
    y = np.full((n, h, w, cout), np.nan, F32)
    acc = np.empty((0, 0, 0), F32)
    if pooled:
        WG.winograd_parallel(x, u, y.reshape(-1, cout), v, m, r, acc, bands, *NONE, nparts)
    else:
        for t in range(nparts):
            WG.winograd_span(x, u, y.reshape(-1, cout), v, m, r, acc, bands, *NONE, t, nparts)
    return y


@pytest.mark.parametrize("bands", [1, 2, 5, 100])
@pytest.mark.parametrize("nparts", [1, 2, 3])
def test_any_chunk_and_partition_gives_the_result_and_the_pool_the_same_bits(bands, nparts):
    x, wt = _inputs(3, 9, 7, 16, 16, seed=1)   # 15 bands of 4 tiles, the last of each sample one row high
    serial = _run(x, wt, bands, nparts, pooled=False)
    _assert_close(serial, _reference(x, wt))
    assert serial.tobytes() == _run(x, wt, bands, nparts, pooled=True).tobytes()


G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])


def _g_g_gt(wt):
    """``G g G^T`` in float64 for each (input, output) channel of an OHWI weight: ``(16, Cin, Cout)``."""
    cout, _, _, cin = wt.shape
    return np.einsum("ai,oijc,bj->abco", G, wt.astype(np.float64), G).reshape(16, cin, cout)


@pytest.mark.parametrize("cout,cin", [(24, 40), (40, 24), (64, 64), (17, 130)])   # whole and cut-off channel blocks
def test_the_weight_transform_is_g_g_gt(cout, cin):
    wt = np.random.default_rng(2).standard_normal((cout, 3, 3, cin)).astype(F32)
    want = _g_g_gt(wt)
    np.testing.assert_allclose(WG.weight_transform(wt), want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("cout,cin", [(24, 40), (64, 64), (17, 130)])
def test_the_turned_transform_is_that_of_the_input_gradients_weight(cout, cin):
    """The input gradient's weight turns the kernel by 180 degrees and swaps the channels (checked against the
    reference's input gradient); the turned transform is that weight's ``G g G^T``."""
    x, wt = _inputs(1, 5, 6, cin, cout)
    dy = np.random.default_rng(5).standard_normal((1, 5, 6, cout))
    turned = wt[:, ::-1, ::-1, :].transpose(3, 1, 2, 0)
    want_dx, _ = R.conv2d_backward(x.astype(np.float64), wt.astype(np.float64), dy, 1, 1, 1)
    np.testing.assert_allclose(R.conv2d_forward(dy, turned.astype(np.float64), 1, 1, 1), want_dx, atol=1e-9)
    want = _g_g_gt(turned)
    np.testing.assert_allclose(WG.weight_transform(wt, turned=True), want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("tiles_per_band,cin,cout,small,bands", [
    (7, 256, 256, 1_000_000, 2),     # small-matrix kernels: 15 tiles of 256x256 stay under a million MACs
    (28, 64, 64, 1_000_000, 8),
    (7, 256, 256, 0, 36),            # packed kernels: 256 tiles, whatever the channels
    (14, 64, 64, 0, 18),
    (8, 512, 512, 1_000_000, 1),     # never less than one band
])
def test_the_chunk_follows_the_blas(tiles_per_band, cin, cout, small, bands):
    assert WG.chunk_bands(tiles_per_band, cin, cout, small) == bands


@pytest.mark.parametrize("w_shape,stride,pad,groups,forward,dx", [
    # dx: with 16 registers / with 32 (the direct input gradient takes 64 input channels there)
    ((64, 3, 3, 64), 1, 1, 1, "winograd", ("winograd", "direct")),   # resnet50's 3x3 layers of 64-256 channels
    ((128, 3, 3, 128), 1, 1, 1, "winograd", ("winograd", "winograd")),
    ((256, 3, 3, 256), 1, 1, 1, "winograd", ("winograd", "winograd")),
    ((128, 3, 3, 64), 1, 1, 1, "winograd", ("winograd", "direct")),  # VGG's widening layers
    ((256, 3, 3, 128), 1, 1, 1, "winograd", ("winograd", "winograd")),
    ((512, 3, 3, 512), 1, 1, 1, "gemm", ("gemm", "gemm")),   # 512: the weight transform costs more than it gains
    ((256, 3, 3, 512), 1, 1, 1, "gemm", ("gemm", "gemm")),
    ((32, 3, 3, 32), 1, 1, 1, "direct", ("direct", "direct")),      # too few channels
    ((64, 3, 3, 32), 1, 1, 1, None, None),          # the direct forward with 32 registers, else GEMM
    ((64, 3, 3, 64), 2, 1, 1, None, None),          # stride 2
    ((64, 3, 3, 64), 1, 0, 1, None, None),          # no padding
    ((64, 3, 3, 32), 1, 1, 2, "gemm", ("gemm", "gemm")),   # grouped
    ((64, 5, 5, 64), 1, 2, 1, None, None),          # 5x5
])
def test_the_rule_takes_winograd_for_3x3_stride_1_layers_of_64_to_256_channels(w_shape, stride, pad, groups, forward,
                                                                               dx):
    for k, registers in enumerate((16, 32)):
        chosen = conv_algorithms(w_shape, stride, pad, groups, registers=registers)
        if forward is None:
            assert "winograd" not in chosen, (registers, chosen)
            continue
        assert (chosen.forward, chosen.input_grad) == (forward, dx[k]), registers
        if chosen.input_grad == "winograd":
            assert chosen.weight_grad == "gemm"   # a pass of its own


@pytest.mark.parametrize("image,pays", [
    ((8, 14, 14), True),      # resnet50's 256-channel layers at batch 8: 392 tiles
    ((3, 14, 14), True),      # 147
    ((1, 24, 24), True),      # 144: the least
    ((1, 22, 24), False),     # 132
    ((1, 14, 14), False),     # 49: batch 1
    ((2, 8, 8), False),       # 32
    ((32, 7, 7), True),       # 512 tiles filled 77%
    ((32, 5, 5), False),      # 288 tiles filled 69%
    ((128, 3, 3), False),     # 512 tiles filled 56%
    ((256, 1, 1), False),     # 25%
])
def test_winograd_pays_on_enough_full_tiles(image, pays):
    assert winograd_pays(*image) is pays
    chosen = conv_algorithms((128, 3, 3, 128), 1, 1, 1, image, registers=16)
    assert chosen == (("winograd", "winograd", "gemm") if pays else ("gemm", "gemm", "gemm"))


def test_the_kernels_own_rule_reads_the_input_image(monkeypatch):
    """Without the plan's choice, the kernels apply the rule to the input they get: a batch of 1 at 14x14 is too
    little work for Winograd, 8 is enough."""
    ran = []
    original = C._run_winograd
    monkeypatch.setattr(C, "_run_winograd", lambda *a, **k: (ran.append(a[0].shape[0]), original(*a, **k))[1])
    for n in (1, 8):
        x, wt = _inputs(n, 14, 14, 64, 64)
        y = np.empty((n, 14, 14, 64), F32)
        K.conv2d_forward(x, wt, y, 1, 1, 1, np.empty(n * 14 * 14 * 9 * 64, F32))
        _assert_close(y, _reference(x, wt))
    assert ran == [8]


def test_conv2d_forward_runs_winograd_where_the_plan_recorded_it(monkeypatch):
    """The plan's algorithms decide, not the kernels' own rule; no im2col workspace is needed."""
    monkeypatch.setattr(C, "conv_algorithms", None)   # the rule must not be consulted
    called = []
    original = C._run_winograd
    monkeypatch.setattr(C, "_run_winograd", lambda *a, **k: (called.append(1), original(*a, **k))[1])
    x, wt = _inputs(2, 5, 5, 8, 8)
    y = np.empty((2, 5, 5, 8), F32)
    K.conv2d_forward(x, wt, y, 1, 1, 1, np.empty(0, F32), WINOGRAD)
    assert called == [1]
    _assert_close(y, _reference(x, wt))
    dx, dw = np.empty(x.shape, F32), np.empty(wt.shape, F32)
    K.conv2d_backward(x, wt, y, dx, dw, 1, 1, 1, np.empty(2 * 25 * 9 * 8, F32), False, WINOGRAD)
    assert called == [1, 1]


@pytest.mark.parametrize("w_shape,stride,pad,groups", [((8, 3, 3, 8), 2, 1, 1), ((8, 3, 3, 8), 1, 0, 1),
                                                       ((8, 5, 5, 8), 1, 1, 1), ((8, 3, 3, 4), 1, 1, 2)])
def test_winograd_refuses_a_shape_it_cannot_compute(w_shape, stride, pad, groups):
    x = np.ones((1, 6, 6, 8), F32)
    with pytest.raises(ValueError, match="conv2d_forward: the winograd algorithm computes 3x3 convolutions of stride"):
        K.conv2d_forward(x, np.ones(w_shape, F32), np.empty((1, 6, 6, 8), F32), stride, pad, groups, None, WINOGRAD)
    with pytest.raises(ValueError, match="conv2d_backward: the winograd algorithm computes 3x3 convolutions"):
        K.conv2d_backward(x, np.ones(w_shape, F32), np.ones((1, 6, 6, 8), F32), np.empty(x.shape, F32),
                          np.empty(w_shape, F32), stride, pad, groups, np.empty(6 * 6 * 9 * 8, F32), False, WINOGRAD)


def test_a_workspace_is_kept_per_thread_and_name_and_grows():
    a = workspace("test a", (2, 3))
    assert a.shape == (2, 3) and a.dtype == F32 and a.flags.c_contiguous
    assert np.shares_memory(workspace("test a", (6,)), a)           # the same memory again
    assert not np.shares_memory(workspace("test b", (2, 3)), a)      # another name, other memory
    big = workspace("test a", (4, 5))                                 # larger: new memory, kept from then on
    assert big.shape == (4, 5) and np.shares_memory(workspace("test a", (2, 3)), big)
    other = []
    thread = threading.Thread(target=lambda: other.append(workspace("test a", (2, 3))))
    thread.start()
    thread.join()
    assert not np.shares_memory(other[0], big)                        # another thread, its own


def test_winograd_runs_repeat_with_their_workspaces_reused():
    """Second calls, whose workspaces hold the first calls' values, give the same bits (a larger layer in between
    grows them)."""
    x, wt = _inputs(2, 9, 7, 16, 24, seed=4)
    first = np.empty((2, 9, 7, 24), F32)
    K.conv2d_forward(x, wt, first, 1, 1, 1, None, WINOGRAD)
    big_x, big_w = _inputs(1, 12, 12, 64, 64, seed=5)
    K.conv2d_forward(big_x, big_w, np.empty((1, 12, 12, 64), F32), 1, 1, 1, None, WINOGRAD)
    again = np.full_like(first, np.nan)
    K.conv2d_forward(x, wt, again, 1, 1, 1, None, WINOGRAD)
    assert first.tobytes() == again.tobytes()


def test_the_weight_transform_refuses_an_array_of_another_shape():
    wt = np.zeros((24, 3, 3, 40), F32)
    with pytest.raises(ValueError, match=r"u must be a C-contiguous \(16, 40, 24\) array"):
        WG.weight_transform(wt, u=np.empty((16, 24, 40), F32))
    WG.weight_transform(wt, turned=True, u=np.empty((16, 24, 40), F32))   # the turned transform's shape
