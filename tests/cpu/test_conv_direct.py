"""The direct convolution forward (`cpu_ref._conv_direct`) against the numpy reference, at shapes that take
every branch: a block of several pixels (8, 4, 2 or 1 per block for 8, 16, 32 and 64 output channels),
the single pixels after the last whole block, both borders, rows cut off at the top and bottom, strides,
no padding, a 5x5 window, a non-square image; the serial and thread-pool runs give the same bits; and the
rule that sends a layer there."""
import numpy as np
import pytest

from cpu_ref import _conv_direct as D
from cpu_ref import kernels as K
from planner import reference as R

F32 = np.float32
TOL = 1e-5   # fp32 sums of at most 5*5*6 products against the float64 reference

CASES = [
    # n, h, w, cin, cout, k, stride, pad
    (2, 7, 9, 3, 16, 3, 1, 1),     # the stem: 4-pixel blocks, then single pixels, both borders
    (2, 6, 11, 3, 8, 3, 1, 1),     # 8-pixel blocks
    (1, 9, 9, 5, 32, 3, 2, 1),     # stride 2, 2-pixel blocks
    (1, 8, 8, 4, 64, 3, 2, 1),     # 1-pixel blocks (the kernel takes them; the rule does not choose them)
    (2, 9, 10, 6, 16, 5, 2, 2),    # 5x5 window, two columns of border taps
    (1, 9, 9, 3, 16, 3, 2, 0),     # no padding: every pixel inside
    (1, 3, 3, 3, 16, 3, 1, 1),     # fewer columns than a block
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
    span, parallel = D._kernels(cout)
    wk = np.ascontiguousarray(wt.transpose(1, 2, 3, 0))
    oh, ow = R.conv_output_size(h, k, s, p), R.conv_output_size(w, k, s, p)
    serial, pooled = np.empty((n, oh, ow, cout), F32), np.empty((n, oh, ow, cout), F32)
    span(x, wk, serial, s, p, 0, 1)
    parallel(x, wk, pooled, s, p, 3)
    assert serial.tobytes() == pooled.tobytes()


@pytest.mark.parametrize("w_shape,stride,groups,direct", [
    ((16, 3, 3, 3), 1, 1, True),      # resnet20's stem: 27-column patches
    ((32, 3, 3, 16), 2, 1, True),     # strided
    ((16, 3, 3, 16), 1, 1, False),    # wide enough for im2col + GEMM
    ((64, 3, 3, 32), 2, 1, False),    # one pixel per register block
    ((12, 3, 3, 3), 1, 1, False),     # not whole 8-float vectors
    ((32, 1, 1, 16), 2, 1, False),    # 1x1: no window to walk
    ((16, 3, 3, 4), 2, 2, False),     # grouped
])
def test_the_rule_takes_the_stem_and_strided_narrow_layers(w_shape, stride, groups, direct):
    assert D.uses_direct_forward(w_shape, stride, groups) is direct


def test_conv2d_forward_takes_the_direct_path_without_a_workspace():
    x, wt = _inputs(2, 7, 9, 3, 16, 3)
    y = np.empty((2, 7, 9, 16), F32)
    K.conv2d_forward(x, wt, y, 1, 1, 1, np.empty(0, F32))   # the general path would refuse this workspace
    want = R.conv2d_forward(x.astype(np.float64), wt.astype(np.float64), 1, 1, 1)
    np.testing.assert_allclose(y, want, rtol=TOL, atol=TOL * float(np.abs(want).max()))
