"""The GEMM launchers of a plan by kernel family: ``GEMM_KERNELS[name]`` for ``kernels="mma" | "simt"``.

Both families have the same four functions with the SIMT signatures (``_conv`` / ``_linear``).
"mma" runs the tensor-core kernels wherever they apply and the SIMT kernels elsewhere; "simt" is
the reference. Where they apply (groups 1 throughout; depthwise and grouped convolutions stay SIMT):
- a convolution's forward: any channel counts (Cin % 8 != 0: the any-channel variant, where nothing
  else fits; the AMP stem reads its input zero-padded to 8 channels and takes the aligned kernels,
  ``padded_stem``);
- its backward (input and weight gradient together): Cout % 8 == 0, and Cin % 8 == 0 unless no
  input gradient is needed (the stem; a padded stem's weight gradient drops the padded columns).
  The fused kinds require multiples of 8 (but the stem's input), so only a convolution outside
  them can leave its backward to SIMT;
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
    kernels = mma_conv.FORWARD if w_shape[3] % CHUNK == 0 else mma_conv.FORWARD_ANY_CHANNELS
    return excluded("forward", tile, kernels[tile, epilogue].dynamic_shared_bytes)


def backward_excluded(x_shape, w_shape, stride, with_dx):
    """The weight gradient's tile, or the input gradient's (when ``with_dx``), is excluded."""
    wgrad = mma_wgrad.wgrad_tile(w_shape)
    if excluded("wgrad", wgrad, mma_wgrad.WGRAD[wgrad, w_shape[3] % CHUNK != 0].dynamic_shared_bytes):
        return True
    dgrad = mma_dgrad.dgrad_tile(w_shape, x_shape, stride) if with_dx else None
    return with_dx and excluded("dgrad", dgrad, mma_dgrad.DGRAD[dgrad].dynamic_shared_bytes)


def conv2d_forward(launcher, x, w, y, stride, pad, groups, bn_sums=None):
    if mma_conv.mma_supported(tuple(x.shape), tuple(w.shape), groups) and forward_excluded(tuple(w.shape), y.size):
        _conv.conv2d_forward(launcher, x, w, y, stride, pad, groups, bn_sums)
        return
    mma_conv.conv2d_forward(launcher, x, w, y, stride, pad, groups, bn_sums)   # falls back to SIMT itself


def conv2d_backward(launcher, x, w, dy, dx, dw, stride, pad, groups, accumulate):
    """``dw`` (fp32) is overwritten; ``dx`` (fp16, or None) overwritten or accumulated."""
    c_out, _, _, c_in = w.shape
    padded = tuple(dw.shape)[-1] != c_in   # a stem on its zero-padded input: only the aligned weight gradient drops the padding
    # the weight gradient takes any Cin (stems, whose input needs no gradient); the input gradient not
    if padded and (dx is not None or backward_excluded(tuple(x.shape), tuple(w.shape), stride, False)):
        raise ValueError(f"conv2d_backward: a padded stem (w {tuple(w.shape)}, dw {tuple(dw.shape)}) needs the aligned "
                         f"tensor-core weight gradient and no input gradient; run it with kernels='mma' and the "
                         f"tile not excluded, or unpadded")
    if not (mma_wgrad.wgrad_supported(tuple(x.shape), tuple(w.shape), groups)
            and (dx is None or (_gemm_ready(c_in, c_out, groups) and max(w.shape[1:3]) <= mma_conv.MAX_TAPS))
            and not backward_excluded(tuple(x.shape), tuple(w.shape), stride, dx is not None)):
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
