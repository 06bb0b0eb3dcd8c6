"""Fully connected layers: ``y = x @ W.T + b`` with ``x (N, in)`` fp16, ``W (out, in)`` fp16
copies, ``b`` fp32 master; gradients fp32.

A linear layer is a 1x1 convolution over ``N`` one-pixel images, so it runs the same
tiled implicit-GEMM kernels (``_conv``); only the bias epilogue and the bias gradient
are its own.
"""
from numba import cuda

from ._conv import conv2d_backward, conv2d_forward, conv_geometry, forward_mainloop
from .gemm import BLOCK, CONV_GEOMETRY, gemm_grid
from .registry import F1, H1, ZERO, grid_1d, kernel, nbt
from ._tile import BM, BN, TM, TN, tile_col, tile_row

f16, f32 = nbt.float16, nbt.float32


@kernel("linear_forward_bias", (H1, H1, F1, H1, CONV_GEOMETRY))
def _linear_forward_bias(x, w, bias, y, geo):
    acc = cuda.local.array((TM, TN), nbt.float32)
    m0, n0 = cuda.blockIdx.x * BM, cuda.blockIdx.y * BN
    forward_mainloop(x, w, geo, 0, m0, n0, 0, geo[2], acc)
    for i in range(TM):
        m = m0 + tile_row(i)
        for j in range(TN):
            n = n0 + tile_col(j)
            if m < geo[0] and n < geo[1]:
                y[m * geo[1] + n] = f16(acc[i, j] + bias[n])


@kernel("linear_bias_grad", (H1, F1))
def _linear_bias_grad(dy, db):
    """``db[j] = sum_i dy[i, j]``: one thread per output feature (the batch is short)."""
    features = db.size
    for j in range(cuda.grid(1), features, cuda.gridsize(1)):
        acc = ZERO
        for r in range(dy.size // features):
            acc += f32(dy[r * features + j])
        db[j] = acc


def _as_images(a2d):
    return a2d.reshape(a2d.shape[0], 1, 1, a2d.shape[1])


def linear_forward(launcher, x2d, w, b, y):
    """``y = x2d @ w.T (+ b)``; ``b`` is an fp32 vector or None."""
    if b is None:
        conv2d_forward(launcher, _as_images(x2d), w.reshape(w.shape[0], 1, 1, w.shape[1]), _as_images(y), 1, 0, 1)
        return
    n, f_in = x2d.shape
    f_out = w.shape[0]
    geo = conv_geometry((n, 1, 1, f_in), (f_out, 1, 1, f_in), (n, 1, 1, f_out), 1, 0, 1, n, f_out, f_in)
    launcher.launch(_linear_forward_bias, gemm_grid(n, f_out, 1), BLOCK, x2d.reshape(x2d.size), w.reshape(w.size),
                    b, y.reshape(y.size), geo)


def linear_backward(launcher, x2d, w, dy, dx, dw, db, accumulate):
    """``dx = dy @ w`` (fp16, or None; overwritten or accumulated), ``dw = dy.T @ x2d``, ``db = dy.sum(0)``."""
    conv2d_backward(launcher, _as_images(x2d), w.reshape(w.shape[0], 1, 1, w.shape[1]), _as_images(dy),
                    None if dx is None else _as_images(dx), dw, 1, 0, 1, accumulate)
    if db is not None:
        linear_bias_grad(launcher, dy, db)


def linear_bias_grad(launcher, dy, db):
    """``db = dy.sum(0)`` (fp32) of a ``(N, F)`` fp16 gradient."""
    launcher.launch(_linear_bias_grad, *grid_1d(db.size), dy.reshape(dy.size), db)
