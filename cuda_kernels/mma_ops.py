"""The GEMM launchers of a plan by kernel family: ``GEMM_KERNELS[name]`` for ``kernels="mma" | "simt"``.

Both families have the same four functions with the SIMT signatures (``_conv`` / ``_linear``).
"mma" runs the tensor-core kernels wherever they apply and the SIMT kernels elsewhere; "simt" is
the reference. The tensor-core kernels take groups-1 layers whose channels are multiples of 8 (16-byte
rows); depthwise and grouped convolutions stay SIMT. Under AMP the planner pads every groups-1
convolution with ``Cin % 8 != 0`` to 8k channels (its input and an fp16 weight copy, ``padded_conv``), so:
- a convolution's forward: tensor cores (any Cout);
- its backward (input and weight gradient together): tensor cores where Cout % 8 == 0 (dy's rows);
  a padded stem's weight gradient drops the padded columns; where Cout % 8 != 0 the SIMT kernels run it
  (a padded convolution's on its real channels). The fused kinds require multiples of 8 (but the stem's
  input), so only a convolution outside them can leave its backward to SIMT;
- a fully connected layer (GapFc's too), forward and backward: in and out features multiples of
  8. The planner does not pad a classifier's classes: a 10-class fc runs SIMT.
A tile ``tile_exclusions`` excludes (it failed on this device, or this install cannot run it) runs SIMT.
"""
import math
from types import MappingProxyType, SimpleNamespace

from . import _conv, _linear, mma_conv, mma_dgrad, mma_wgrad
from .mma_tiles import CHUNK, choose_tile
from .registry import flat
from .tile_exclusions import excluded

DEFAULT_KERNELS = "mma"


def _gemm_ready(c_in, c_out, groups):
    return groups == 1 and c_in % CHUNK == 0 and c_out % CHUNK == 0


def forward_excluded(w_shape, y_size, epilogue="plain"):
    tile = mma_conv.forward_tile(w_shape, y_size)
    return excluded("forward", tile, mma_conv.FORWARD[tile, epilogue].dynamic_shared_bytes)


def backward_excluded(x_shape, w_shape, stride, with_dx):
    """The weight gradient's tile, or the input gradient's (when ``with_dx``), is excluded."""
    wgrad = mma_wgrad.wgrad_tile(w_shape)
    if excluded("wgrad", wgrad, mma_wgrad.WGRAD[wgrad].dynamic_shared_bytes):
        return True
    dgrad = mma_dgrad.dgrad_tile(w_shape, x_shape, stride) if with_dx else None
    return with_dx and excluded("dgrad", dgrad, mma_dgrad.DGRAD[dgrad].dynamic_shared_bytes)


def backward_ready(x_shape, w_shape, stride, with_dx):
    """Whether the tensor-core kernels take a groups-1 convolution's backward: channels multiples of 8 (x's those
    of w), at most ``MAX_TAPS`` filter rows and columns for the input gradient, its tiles not excluded."""
    c_out, kh, kw, c_in = w_shape
    return (x_shape[-1] == c_in and _gemm_ready(c_in, c_out, 1)
            and (not with_dx or max(kh, kw) <= mma_conv.MAX_TAPS)
            and not backward_excluded(x_shape, w_shape, stride, with_dx))


def conv2d_forward(launcher, x, w, y, stride, pad, groups, bn_sums=None):
    if mma_conv.mma_supported(tuple(x.shape), tuple(w.shape), groups) and forward_excluded(tuple(w.shape), y.size):
        _conv.conv2d_forward(launcher, x, w, y, stride, pad, groups, bn_sums)
        return
    mma_conv.conv2d_forward(launcher, x, w, y, stride, pad, groups, bn_sums)   # falls back to SIMT itself


def conv2d_backward(launcher, x, w, dy, dx, dw, stride, pad, groups, accumulate):
    """``dw`` (fp32) is overwritten; ``dx`` (fp16, or None) overwritten or accumulated. ``dw`` has fewer channels
    than ``w`` where ``w`` and ``x`` are a padded convolution's (``padded_conv``): its real columns only."""
    padded = tuple(dw.shape)[-1] != w.shape[3]
    if groups != 1 or not backward_ready(tuple(x.shape), tuple(w.shape), stride, dx is not None):
        if padded:
            raise ValueError(f"conv2d_backward: a zero-padded convolution (x {tuple(x.shape)}, w {tuple(w.shape)}, "
                             f"dw {tuple(dw.shape)}) needs the tensor-core backward, which does not take it "
                             f"(Cout % 8 != 0, too many taps or an excluded tile); run its real channels instead")
        _conv.conv2d_backward(launcher, x, w, dy, dx, dw, stride, pad, groups, accumulate)
        return
    mma_wgrad.conv2d_backward_weight(launcher, x, w, dy, dw, stride, pad)
    if dx is not None:
        mma_dgrad.conv2d_backward_data(launcher, w, dy, dx, stride, pad, accumulate)


def _as_images(a2d):
    return a2d.reshape(a2d.shape[0], 1, 1, a2d.shape[1])


def linear_forward(launcher, x2d, w, b, y, tile=None):
    """``y = x2d @ w.T (+ b)``; ``b`` is an fp32 vector or None. ``tile``: as ``mma_conv.conv2d_forward``'s."""
    n, f_in = x2d.shape
    f_out = w.shape[0]
    if not _gemm_ready(f_in, f_out, 1) or (tile is None and forward_excluded(
            (f_out, 1, 1, f_in), n * f_out, "plain" if b is None else "bias")):
        _linear.linear_forward(launcher, x2d, w, b, y)
        return
    w4 = w.reshape(f_out, 1, 1, f_in)
    if b is None:
        mma_conv.conv2d_forward(launcher, _as_images(x2d), w4, _as_images(y), 1, 0, 1, tile=tile)
        return
    geo = _conv.conv_geometry((n, 1, 1, f_in), w4.shape, (n, 1, 1, f_out), 1, 0, 1, n, f_out, f_in)
    tile = tile or choose_tile(n, f_out)
    grid = (math.ceil(n / tile.bm), math.ceil(f_out / tile.bn), 1)
    launcher.launch(mma_conv.FORWARD[tile, "bias"], grid, tile.threads, flat(x2d), flat(w), b, flat(y), geo)


def linear_backward(launcher, x2d, w, dy, dx, dw, db, accumulate):
    """``dx = dy @ w`` (fp16, or None; overwritten or accumulated), ``dw = dy.T @ x2d``, ``db = dy.sum(0)``."""
    f_out, f_in = w.shape
    if not _gemm_ready(f_in, f_out, 1):
        _linear.linear_backward(launcher, x2d, w, dy, dx, dw, db, accumulate)
        return
    conv2d_backward(launcher, _as_images(x2d), w.reshape(f_out, 1, 1, f_in), _as_images(dy),
                    None if dx is None else _as_images(dx), dw, 1, 0, 1, accumulate)
    if db is not None:
        _linear.linear_bias_grad(launcher, dy, db)


MMA = SimpleNamespace(conv2d_forward=conv2d_forward, conv2d_backward=conv2d_backward,
                      linear_forward=linear_forward, linear_backward=linear_backward)
SIMT = SimpleNamespace(conv2d_forward=_conv.conv2d_forward, conv2d_backward=_conv.conv2d_backward,
                       linear_forward=_linear.linear_forward, linear_backward=_linear.linear_backward)
GEMM_KERNELS = MappingProxyType({"mma": MMA, "simt": SIMT})


def gemm_kernels(name):
    """The launcher family ``name``; raises ``ValueError`` naming the choices."""
    if name not in GEMM_KERNELS:
        raise ValueError(f"kernels: expected one of {sorted(GEMM_KERNELS)}, got {name!r}")
    return GEMM_KERNELS[name]
