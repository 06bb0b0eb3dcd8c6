"""prelu on fp16 views: ``y = x`` where ``x > 0``, else ``w[c] * x``, with fp32 slopes ``w`` (the master
weights: one per channel, the last axis, or one shared). Backward: ``dx = dy`` or ``w[c] * dy``, and
``dw[k] = sum of x * dy where x <= 0`` in fp32, one thread per slope walking its elements in order
(deterministic; a simple reduction, not tuned for large maps).
"""
import numpy as np
from numba import cuda

from .registry import F1, H1, I32, ZERO, flat, grid_1d, kernel, nbt

f16, f32 = nbt.float16, nbt.float32


@kernel("prelu_forward", (H1, F1, H1, I32))
def _prelu_forward(x, w, y, channels):
    for i in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        v = f32(x[i])
        y[i] = f16(v if v > ZERO else w[0 if w.size == 1 else i % channels] * v)


@kernel("prelu_backward_x", (H1, F1, H1, H1, I32, I32))
def _prelu_backward_x(x, w, dy, dx, channels, accumulate):
    for i in range(cuda.grid(1), dy.size, cuda.gridsize(1)):
        g = f32(dy[i])
        v = g if f32(x[i]) > ZERO else w[0 if w.size == 1 else i % channels] * g
        if accumulate:
            v += f32(dx[i])
        dx[i] = f16(v)


@kernel("prelu_backward_w", (H1, H1, F1, I32))
def _prelu_backward_w(x, dy, dw, channels):
    stride = 1 if dw.size == 1 else channels
    for k in range(cuda.grid(1), dw.size, cuda.gridsize(1)):
        total = ZERO
        for i in range(k, x.size, stride):
            v = f32(x[i])
            if v <= ZERO:
                total += v * f32(dy[i])
        dw[k] = total


def prelu_forward(launcher, x, w, y):
    launcher.launch(_prelu_forward, *grid_1d(y.size), flat(x), flat(w), flat(y), np.int32(tuple(x.shape)[-1]))


def prelu_backward(launcher, x, w, dy, dx, dw, accumulate):
    """``dx`` may be None (no input gradient wanted); ``dw`` (fp32) is overwritten."""
    channels = np.int32(tuple(x.shape)[-1])
    if dx is not None:
        launcher.launch(_prelu_backward_x, *grid_1d(dy.size), flat(x), flat(w), flat(dy), flat(dx), channels,
                        np.int32(accumulate))
    launcher.launch(_prelu_backward_w, *grid_1d(dw.size), flat(x), flat(dy), flat(dw), channels)
