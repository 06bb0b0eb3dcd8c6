"""The direct convolution forward (`cpu_ref._conv_direct`) against the numpy reference, at shapes that take
every branch: blocks of several pixels (16, 8, 4 and 2 per block for 8, 16, 32 and 64 output channels with 32
vector registers, half as many with 16) whose taps are all inside the row, blocks at both borders whose taps
reach only some of their pixels, a row's last, short block, rows cut off at the top and bottom, strides, no
padding, a 5x5 window, a non-square image; the serial and thread-pool runs give the same bits; and the rule
that sends a layer there."""
import numpy as np
import pytest

from cpu_ref import _conv_direct as D
from cpu_ref import kernels as K
from cpu_ref._epilogue import NONE
from planner import reference as R
from planner.conv_algorithm import FEW_INPUT_CHANNELS, ConvAlgorithms, conv_algorithms, target_vector_registers
from tests.support.float32_error import assert_like_float32

F32 = np.float32
TOL = 1e-5   # fp32 sums of at most 5*5*6 products against the float64 reference

CASES = [
    # n, h, w, cin, cout, k, stride, pad
    (2, 7, 9, 3, 16, 3, 1, 1),     # the stem: 4-pixel blocks, then single pixels, both borders
    (2, 6, 11, 3, 8, 3, 1, 1),     # 8-pixel blocks
    (1, 9, 9, 5, 32, 3, 2, 1),     # stride 2, 2-pixel blocks
    (1, 8, 8, 4, 64, 3, 2, 1),     # 2-pixel blocks with 32 vector registers, else 1 (the rule does not choose those)
    (2, 9, 10, 6, 16, 5, 2, 2),    # 5x5 window, two columns of border taps
    (1, 9, 9, 3, 16, 3, 2, 0),     # no padding: every pixel inside
    (1, 3, 3, 3, 16, 3, 1, 1),     # fewer columns than a block
    # rows wide enough for blocks with every tap inside between the two border blocks, whatever the block
    (1, 3, 37, 3, 8, 3, 1, 1),
    (1, 4, 21, 5, 16, 3, 1, 1),
    (1, 3, 19, 5, 32, 3, 2, 1),
    (2, 3, 8, 4, 64, 3, 1, 1),
    (2, 7, 9, 16, 32, 1, 2, 0),    # 1x1 strided (a shortcut)
]


def _inputs(n, h, w, cin, cout, k, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, h, w, cin)).astype(F32), rng.standard_normal((cout, k, k, cin)).astype(F32)


@pytest.mark.parametrize("n,h,w,cin,cout,k,s,p", CASES)
def test_direct_forward_matches_the_reference(n, h, w, cin, cout, k, s, p):
    x, wt = _inputs(n, h, w, cin, cout, k)
    want = R.conv2d_forward(x.astype(np.float64), wt.astype(np.float64), s, p, 1)
    y = np.full(want.shape, np.nan, F32)   # every element must be written
    D.direct_forward(x, wt, y, s, p, work=1)
    np.testing.assert_allclose(y, want, rtol=TOL, atol=TOL * float(np.abs(want).max()))


@pytest.mark.parametrize("n,h,w,cin,cout,k,s,p", CASES[:3])
def test_the_thread_pool_gives_the_same_bits(n, h, w, cin, cout, k, s, p):
    x, wt = _inputs(n, h, w, cin, cout, k, seed=1)
    span, parallel = D._kernels(cout, s)
    wk = np.ascontiguousarray(wt.transpose(1, 2, 3, 0))
    oh, ow = R.conv_output_size(h, k, s, p), R.conv_output_size(w, k, s, p)
    serial, pooled = np.empty((n, oh, ow, cout), F32), np.empty((n, oh, ow, cout), F32)
    span(x, wk, serial, p, False, *NONE, 0, 1)
    parallel(x, wk, pooled, p, False, *NONE, 3)
    assert serial.tobytes() == pooled.tobytes()


@pytest.mark.parametrize("w_shape,stride,pad,groups,algorithms", [
    ((16, 3, 3, 3), 1, 1, 1, ("direct", "gemm", "direct")),      # resnet20's stem: 3 input channels, dW folded
    ((16, 3, 3, 8), 1, 1, 1, ("direct", "direct", "direct")),
    ((12, 3, 3, 3), 1, 1, 1, ("gemm", "gemm", "gemm")),          # few inputs, but not whole 8-float vectors out
    ((32, 3, 3, 3), 1, 1, 1, ("direct", "gemm", "gemm")),        # 2 pairs per dW block in 16 registers: GEMM
    ((64, 3, 3, 64), 1, 1, 1, ("winograd", "winograd", "gemm")),  # one pixel per block in 16 registers
    ((16, 3, 3, 16), 1, 1, 1, ("direct", "direct", "direct")),   # the narrow layers
    ((32, 3, 3, 16), 2, 1, 1, ("direct", "direct", "direct")),
    ((32, 3, 3, 32), 1, 1, 1, ("direct", "direct", "direct")),
    ((64, 3, 3, 32), 2, 1, 1, ("gemm", "direct", "gemm")),       # one pixel (input channel) per block: GEMM
    ((32, 3, 3, 64), 1, 1, 1, ("direct", "gemm", "gemm")),       # dW goes with a GEMM dx
    ((12, 3, 3, 8), 1, 1, 1, ("gemm", "direct", "gemm")),        # not whole 8-float vectors
    ((24, 3, 3, 24), 1, 1, 1, ("gemm", "gemm", "gemm")),         # whole vectors, but not a power of two of them
    ((24, 3, 3, 16), 2, 1, 1, ("gemm", "direct", "gemm")),
    ((16, 3, 3, 24), 1, 1, 1, ("direct", "gemm", "gemm")),
    ((32, 1, 1, 16), 2, 0, 1, ("direct", "direct", "direct")),   # 1x1 strided: im2col would copy every other pixel
    ((32, 1, 1, 16), 1, 0, 1, ("pointwise",) * 3),
    ((16, 3, 3, 1), 1, 1, 16, ("depthwise",) * 3),
    ((16, 3, 3, 4), 2, 1, 2, ("gemm", "gemm", "gemm")),          # grouped
])
def test_the_rule_takes_the_narrow_layers(w_shape, stride, pad, groups, algorithms):
    assert tuple(conv_algorithms(w_shape, stride, pad, groups, registers=16)) == algorithms


@pytest.mark.parametrize("w_shape,stride,algorithms", [
    ((64, 3, 3, 64), 1, ("winograd", "direct", "direct")),  # 2-pixel blocks of 64 channels fit 32 registers
    ((64, 3, 3, 32), 2, ("direct", "direct", "direct")),
    ((16, 3, 3, 16), 1, ("direct", "direct", "direct")),
    ((128, 3, 3, 64), 1, ("winograd", "direct", "gemm")),  # 128 channels: one pixel per block
    ((48, 3, 3, 48), 1, ("gemm", "gemm", "gemm")),        # 48 or 40 channels: not a power of two of vectors
    ((40, 3, 3, 64), 2, ("gemm", "direct", "gemm")),
    ((64, 1, 1, 64), 2, ("direct", "direct", "direct")),  # 1x1 strided
    ((64, 7, 7, 3), 2, ("direct", "gemm", "gemm")),       # resnet50's stem: 2 pairs per dW block, GEMM
    ((32, 3, 3, 3), 1, ("direct", "gemm", "direct")),     # 4 pairs per dW block: folded
])
def test_with_32_vector_registers_the_rule_takes_64_channels(w_shape, stride, algorithms):
    assert tuple(conv_algorithms(w_shape, stride, 1, 1, registers=32)) == algorithms
    if max(w_shape[0], w_shape[3]) > 32:   # the default reads the target's registers
        assert conv_algorithms(w_shape, stride, 1, 1) == conv_algorithms(w_shape, stride, 1, 1,
                                                                          registers=target_vector_registers())


@pytest.mark.parametrize("features,registers", [("+avx,+avx2,+fma,-avx512f", 16), ("+avx2,+avx512f,+fma", 32)])
def test_the_target_registers_follow_numbas_features(features, registers, monkeypatch):
    monkeypatch.setenv("NUMBA_CPU_FEATURES", features)
    target_vector_registers.cache_clear()
    try:
        assert target_vector_registers() == registers
    finally:
        target_vector_registers.cache_clear()


def test_conv2d_forward_takes_the_direct_path_without_a_workspace():
    x, wt = _inputs(2, 7, 9, 3, 16, 3)
    y = np.empty((2, 7, 9, 16), F32)
    K.conv2d_forward(x, wt, y, 1, 1, 1, np.empty(0, F32))   # the general path would refuse this workspace
    want = R.conv2d_forward(x.astype(np.float64), wt.astype(np.float64), 1, 1, 1)
    np.testing.assert_allclose(y, want, rtol=TOL, atol=TOL * float(np.abs(want).max()))


# ---------------------------------------------------------------------------- backward: input and weight gradient

BACKWARD_CASES = [
    # n, h, w, cin, cout, k, stride, pad
    (2, 7, 9, 16, 16, 3, 1, 1),    # stride 1: dx by the forward kernel (8-pixel blocks, 4 with 16 registers)
    (1, 4, 21, 16, 8, 3, 1, 1),    # ... a row wide enough for a block with every tap inside
    (1, 3, 37, 16, 16, 3, 2, 1),   # stride 2: phases of 19 and 18 pixels, whole and short blocks
    (2, 7, 9, 16, 32, 1, 2, 0),    # 1x1 strided: the odd input pixels receive nothing
    (1, 9, 9, 16, 32, 3, 2, 1),    # stride 2, odd input: two phases of 5 and 4 pixels
    (1, 8, 6, 32, 32, 3, 2, 1),    # stride 2, even input; 2-pixel dx blocks (4 with 32 registers)
    (3, 5, 5, 32, 16, 3, 1, 1),    # 32 input channels in the lanes of dx; 4-channel dw blocks
    (1, 10, 11, 8, 8, 5, 2, 2),    # 5x5 window, 8-wide lanes, 8-pixel blocks (16 with 32 registers)
    (2, 9, 9, 8, 16, 3, 2, 0),     # no padding: the last input row and column receive nothing
    (1, 3, 3, 16, 16, 3, 1, 1),    # fewer columns than a block
    (2, 7, 7, 3, 16, 3, 1, 1),     # the stem's weight gradient: 3 input channels, no whole block
    (1, 7, 7, 6, 16, 3, 2, 1),     # 6 input channels: a whole block of 4 (8 with AVX-512), then single ones
    (2, 5, 6, 64, 64, 3, 1, 1),    # 64 channels: 2-pixel / 2-channel blocks with 32 vector registers, else 1
    (1, 7, 7, 32, 64, 3, 2, 1),
    # fewer than FEW_INPUT_CHANNELS: blocks across the kernel's columns (`_folded_weight_grad_kernels`)
    (2, 9, 11, 3, 16, 7, 2, 3),    # resnet50's stem window: 21 pairs per kernel row, three border columns a side
    (1, 6, 7, 5, 32, 3, 1, 1),     # 15 pairs: whole blocks of 2 or 4, then single pairs
    (1, 8, 8, 1, 8, 5, 2, 0),      # one channel, no padding: every column inside
    (1, 5, 4, 3, 16, 5, 1, 2),     # fewer columns than the window: no column has all its taps inside
]


def _backward_inputs(n, h, w, cin, cout, k, s, p, seed=2):
    rng = np.random.default_rng(seed)
    x, wt = _inputs(n, h, w, cin, cout, k, seed)
    dy = rng.standard_normal((n, R.conv_output_size(h, k, s, p), R.conv_output_size(w, k, s, p), cout)).astype(F32)
    want_dx, want_dw = R.conv2d_backward(x.astype(np.float64), wt.astype(np.float64), dy.astype(np.float64), s, p, 1)
    f32_dx, f32_dw = R.conv2d_backward(x, wt, dy, s, p, 1)     # numpy float32: the error float32 is allowed
    return x, wt, dy, (want_dx, f32_dx), (want_dw, f32_dw)


@pytest.mark.parametrize("n,h,w,cin,cout,k,s,p", [c for c in BACKWARD_CASES if c[3] % 8 == 0])
@pytest.mark.parametrize("accumulate", [False, True])
def test_direct_input_grad_matches_the_reference(n, h, w, cin, cout, k, s, p, accumulate):
    x, wt, dy, (want, f32), _ = _backward_inputs(n, h, w, cin, cout, k, s, p)
    before = np.random.default_rng(3).standard_normal(x.shape).astype(F32)
    dx = before.copy() if accumulate else np.full(x.shape, np.nan, F32)   # every element must be written
    D.direct_input_grad(dy, wt, dx, s, p, accumulate, work=1)
    offset = before if accumulate else 0
    assert_like_float32("dx", dx - offset, f32, want, oracle="numpy float32")


@pytest.mark.parametrize("n,h,w,cin,cout,k,s,p", BACKWARD_CASES)
def test_direct_weight_grad_matches_the_reference(n, h, w, cin, cout, k, s, p):
    x, wt, dy, _, (want, f32) = _backward_inputs(n, h, w, cin, cout, k, s, p)
    dw = D.direct_weight_grad(x, dy, wt.shape, s, p, work=1)
    assert dw.shape == wt.shape
    assert_like_float32("dw", dw, f32, want, oracle="numpy float32")


@pytest.mark.parametrize("n,h,w,cin,cout,k,s,p", BACKWARD_CASES[:3])
def test_the_backward_thread_pool_gives_the_same_bits(n, h, w, cin, cout, k, s, p):
    x, wt, dy, _, _ = _backward_inputs(n, h, w, cin, cout, k, s, p)
    serial, pooled = np.empty_like(x), np.empty_like(x)
    span, _, args = D.input_grad_kernel(dy, wt, serial, s, p, False)
    span(*args, 0, 1)
    _, parallel, args = D.input_grad_kernel(dy, wt, pooled, s, p, False)
    parallel(*args, 3)
    assert serial.tobytes() == pooled.tobytes()
    span, parallel = D._weight_grad_kernels(cout)
    serial, pooled = (np.zeros((2, k, k, cin, cout), F32) for _ in range(2))
    for t in range(2):
        span(x, dy, serial, s, p, t, 2)
    parallel(x, dy, pooled, s, p, 2)
    assert serial.tobytes() == pooled.tobytes()


@pytest.mark.parametrize("n,h,w,cin,cout,k,s,p", [c for c in BACKWARD_CASES if c[3] < FEW_INPUT_CHANNELS][:2])
def test_the_folded_weight_grad_thread_pool_gives_the_same_bits(n, h, w, cin, cout, k, s, p):
    x, wt, dy, _, _ = _backward_inputs(n, h, w, cin, cout, k, s, p)
    span, parallel = D._folded_weight_grad_kernels(cout)
    serial, pooled = (np.zeros((2, k, k, cin, cout), F32) for _ in range(2))
    for t in range(2):
        span(x, dy, serial, s, p, t, 2)
    parallel(x, dy, pooled, s, p, 2)
    assert serial.tobytes() == pooled.tobytes()


@pytest.mark.parametrize("cin,cout,want_dx", [(16, 32, True), (32, 64, True), (3, 16, False), (16, 32, False)])
def test_conv2d_backward_combines_the_direct_and_general_paths(cin, cout, want_dx):
    """Both gradients direct (16->32), dx direct and dW by GEMM (32->64), dW direct (folded) without dx (the
    stem), dW direct without dx (16->32)."""
    n, h, w, k, s, p = 2, 7, 7, 3, 2, 1
    x, wt, dy, (want_dx_, f32_dx), (want_dw, f32_dw) = _backward_inputs(n, h, w, cin, cout, k, s, p)
    col = np.empty(n * 4 * 4 * k * k * cin, F32)
    dx = np.full(x.shape, np.nan, F32) if want_dx else None
    dw = np.full(wt.shape, np.nan, F32)
    K.conv2d_backward(x, wt, dy, dx, dw, s, p, 1, col, False)
    assert_like_float32("dw", dw, f32_dw, want_dw, oracle="numpy float32")
    if want_dx:
        assert_like_float32("dx", dx, f32_dx, want_dx_, oracle="numpy float32")


@pytest.mark.parametrize("algorithms", [ConvAlgorithms("direct", "direct", "direct"), ConvAlgorithms("gemm", "gemm", "gemm"),
                                        ConvAlgorithms("gemm", "direct", "gemm")])
def test_the_kernels_run_the_algorithms_the_plan_recorded(algorithms, monkeypatch):
    """`conv2d_forward` / `conv2d_backward` take the ``algorithms`` they are given (the plan's), not their own rule."""
    from cpu_ref import _conv as C
    monkeypatch.setattr(C, "conv_algorithms", None)   # the rule must not be consulted
    called = []
    for name in ("direct_forward", "direct_input_grad", "direct_weight_grad", "_run_gemm"):
        original = getattr(C, name)
        monkeypatch.setattr(C, name, lambda *a, _f=original, _n=name, **k: (called.append(_n), _f(*a, **k))[1])
    n, h, w, cin, cout, k, s, p = 2, 7, 7, 16, 16, 3, 1, 1
    x, wt, dy, (want_dx, f32_dx), (want_dw, f32_dw) = _backward_inputs(n, h, w, cin, cout, k, s, p)
    col = np.empty(n * h * w * k * k * cin, F32)
    y, dx, dw = np.empty(dy.shape, F32), np.empty(x.shape, F32), np.empty(wt.shape, F32)
    K.conv2d_forward(x, wt, y, s, p, 1, col, algorithms)
    K.conv2d_backward(x, wt, dy, dx, dw, s, p, 1, col, False, algorithms)
    want_y = R.conv2d_forward(x.astype(np.float64), wt.astype(np.float64), s, p, 1)
    np.testing.assert_allclose(y, want_y, rtol=TOL, atol=TOL * float(np.abs(want_y).max()))
    assert_like_float32("dx", dx, f32_dx, want_dx, oracle="numpy float32")
    assert_like_float32("dw", dw, f32_dw, want_dw, oracle="numpy float32")
    expected = ["direct_forward" if algorithms.forward == "direct" else "_run_gemm"]
    expected += ["direct_input_grad", "_run_gemm"] if algorithms.input_grad == "direct" else ["_run_gemm"]
    if algorithms.weight_grad == "direct":
        expected = expected[:1] + ["direct_input_grad", "direct_weight_grad"]
    assert called == expected
