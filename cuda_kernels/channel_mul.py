"""channel_mul on fp16 NHWC views: ``y[n, h, w, c] = x[n, h, w, c] * s[n, c]`` (the squeeze-excitation
scale), and its backward ``dx = dy * s``, ``ds[n, c] = sum_{h, w} dy * x`` (fp32 sums, one thread per
(n, c)). Flat views; ``hw`` is H * W, ``channels`` C.
"""
import numpy as np
from numba import cuda

from .registry import H1, I32, ZERO, flat, grid_1d, kernel, nbt

f16, f32 = nbt.float16, nbt.float32


@kernel("channel_mul_forward", (H1, H1, H1, I32, I32))
def _channel_mul_forward(x, s, y, hw, channels):
    for i in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        n = i // (hw * channels)
        y[i] = f16(f32(x[i]) * f32(s[n * channels + i % channels]))


@kernel("channel_mul_backward_x", (H1, H1, H1, I32, I32, I32))
def _channel_mul_backward_x(s, dy, dx, hw, channels, accumulate):
    for i in range(cuda.grid(1), dy.size, cuda.gridsize(1)):
        n = i // (hw * channels)
        v = f32(dy[i]) * f32(s[n * channels + i % channels])
        if accumulate:
            v += f32(dx[i])
        dx[i] = f16(v)


@kernel("channel_mul_backward_s", (H1, H1, H1, I32, I32, I32))
def _channel_mul_backward_s(x, dy, ds, hw, channels, accumulate):
    for j in range(cuda.grid(1), ds.size, cuda.gridsize(1)):
        n, c = j // channels, j % channels
        base = n * hw * channels + c
        total = ZERO
        for k in range(hw):
            total += f32(dy[base + k * channels]) * f32(x[base + k * channels])
        if accumulate:
            total += f32(ds[j])
        ds[j] = f16(total)


def _geometry(x):
    n, h, w, c = tuple(x.shape)
    return np.int32(h * w), np.int32(c)


def channel_mul_forward(launcher, x, s, y):
    launcher.launch(_channel_mul_forward, *grid_1d(y.size), flat(x), flat(s), flat(y), *_geometry(x))


def channel_mul_backward(launcher, x, s, dy, dx, ds, accumulate_dx, accumulate_ds):
    """``dx`` (like ``x``) and ``ds`` (like ``s``) may each be None (no gradient wanted)."""
    hw, channels = _geometry(x)
    if dx is not None:
        launcher.launch(_channel_mul_backward_x, *grid_1d(dy.size), flat(s), flat(dy), flat(dx), hw, channels,
                        np.int32(accumulate_dx))
    if ds is not None:
        launcher.launch(_channel_mul_backward_s, *grid_1d(ds.size), flat(x), flat(dy), flat(ds), hw, channels,
                        np.int32(accumulate_ds))
