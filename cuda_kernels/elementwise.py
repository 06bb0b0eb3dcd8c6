"""Elementwise kernels on flat fp16 views: activations, add, channel pad, dropout, casts.

Every activation of the op table gets its two kernels here, compiled from its row's float32 scalar pair
(``planner/scalar_activations.py``, the bodies the CPU path compiles too); adding one touches nothing here.

Forward and backward of each primitive sit side by side. Every kernel is a grid-stride
loop, computes in fp32 and stores fp16; ``accumulate`` (int32 0/1) chooses between
overwriting ``dx`` and adding into it (the contract's gradient accumulation).
"""
import math
from typing import NamedTuple

import numpy as np
from numba import cuda

from planner.kernel_table import activation_kernels, activation_kernels_of
from planner.ops import ACTIVATION_SLOTS, OPS, OpRow

from .registry import B1, F1, F32, H1, I1, I32, U64, W1, ZERO, KernelSpec, flat, grid_1d, kernel, nbt

f16, f32, u64 = nbt.float16, nbt.float32, nbt.uint64


@cuda.jit(device=True)
def _store(dx, i, v, accumulate):
    if accumulate:
        v += f32(dx[i])
    dx[i] = f16(v)


class _Pointwise(NamedTuple):
    forward: KernelSpec
    backward: KernelSpec
    f: object       # the row's scalar pair as device functions (the BN apply fuses relu and relu6 through them)
    grad: object


def pointwise(row: OpRow) -> _Pointwise:
    """The two kernels of the activation ``row`` (an op-table row with its scalar pair), compiled from the
    pair as fp32 device functions: rows ``activation_forward.<kind>`` / ``activation_backward.<kind>`` of
    the kernel table, so no code chooses among activations inside a kernel."""
    if not row.activation:
        raise ValueError(f"pointwise({row.prim!r}): expected an activation row of the op table (planner/ops.py "
                         f"activation(...)), got a row with activation=False")
    f = cuda.jit(device=True)(row.scalar_forward)
    grad = cuda.jit(device=True)(row.scalar_backward)

    def forward(x, y, a, b):
        for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
            y[i] = f16(f(f32(x[i]), a, b))

    def backward(saved, dy, dx, a, b, accumulate):
        for i in range(cuda.grid(1), dy.size, cuda.gridsize(1)):
            _store(dx, i, grad(f32(saved[i]), f32(dy[i]), a, b), accumulate)

    return _Pointwise(kernel(f"activation_forward.{row.prim.value}", (H1, H1, F32, F32))(forward),
                      kernel(f"activation_backward.{row.prim.value}", (H1, H1, H1, F32, F32, I32))(backward), f, grad)


ACTIVATION_KERNELS = activation_kernels(OPS, pointwise)   # Prim -> kernels, every activation row, in table order


def _kernels(prim):
    return activation_kernels_of(ACTIVATION_KERNELS, prim)   # reads the module's table when called


def _slots(params) -> tuple:
    """``params`` (the row's attrs' values, ``planner.ops.activation_params``) as the kernels' float32 slots."""
    return tuple(np.float32(v) for v in tuple(params) + (0.0,) * (ACTIVATION_SLOTS - len(params)))


def activation_forward(launcher, prim, x, y, params=()):
    """``y = act(x)``; ``params``: the activation's parameters in its row's ``attrs`` order."""
    launcher.launch(_kernels(prim).forward, *grid_1d(x.size), flat(x), flat(y), *_slots(params))


def activation_backward(launcher, prim, saved, dy, dx, params=(), accumulate=False):
    launcher.launch(_kernels(prim).backward, *grid_1d(dy.size), flat(saved), flat(dy), flat(dx), *_slots(params),
                    np.int32(accumulate))


@kernel("add_forward", (H1, H1, H1))
def _add_forward(a, b, y):
    for i in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        y[i] = f16(f32(a[i]) + f32(b[i]))


@kernel("accumulate_into", (H1, H1, I32))
def _accumulate_into(dst, src, accumulate):
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        _store(dst, i, f32(src[i]), accumulate)


def add_forward(launcher, a, b, y):
    launcher.launch(_add_forward, *grid_1d(y.size), flat(a), flat(b), flat(y))


def accumulate_into(launcher, dst, src, accumulate):
    """``dst = src`` or ``dst += src`` (the backward of a residual add)."""
    launcher.launch(_accumulate_into, *grid_1d(dst.size), flat(dst), flat(src), np.int32(accumulate))


@kernel("channel_pad_forward", (H1, H1, I32, I32))
def _channel_pad_forward(x, y, c_in, c_out):
    for i in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        c = i % c_out
        y[i] = x[(i // c_out) * c_in + c] if c < c_in else f16(ZERO)


@kernel("channel_pad_backward", (H1, H1, I32, I32, I32))
def _channel_pad_backward(dy, dx, c_in, c_out, accumulate):
    for i in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
        _store(dx, i, f32(dy[(i // c_in) * c_out + i % c_in]), accumulate)


def channel_pad_forward(launcher, x, y):
    """Copy ``x`` into the first channels (last axis) of ``y``; zeros in the new ones."""
    launcher.launch(_channel_pad_forward, *grid_1d(y.size), flat(x), flat(y),
                    np.int32(tuple(x.shape)[-1]), np.int32(tuple(y.shape)[-1]))


def channel_pad_backward(launcher, dy, dx, accumulate):
    launcher.launch(_channel_pad_backward, *grid_1d(dx.size), flat(dy), flat(dx),
                    np.int32(tuple(dx.shape)[-1]), np.int32(tuple(dy.shape)[-1]), np.int32(accumulate))


# Dropout: splitmix64 as in planner.reference.dropout_uniform, in uint64 only (bit-exact).
_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11, _U1 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11), np.uint64(1)


@cuda.jit(device=True)
def _mix64(z):
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


@kernel("dropout_forward", (H1, H1, B1, U64, U64, F32, I1))
def _dropout_forward(x, y, mask, seed, threshold, scale, step):
    key = _mix64(seed * _GOLDEN + u64(step[0]))
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        keep = (_mix64(key + (u64(i) + _U1) * _GOLDEN) >> _S11) >= threshold
        mask[i] = 1 if keep else 0
        y[i] = f16(f32(x[i]) * scale) if keep else f16(ZERO)


@kernel("dropout_backward", (B1, H1, H1, F32, I32))
def _dropout_backward(mask, dy, dx, scale, accumulate):
    for i in range(cuda.grid(1), dy.size, cuda.gridsize(1)):
        _store(dx, i, f32(dy[i]) * scale if mask[i] else ZERO, accumulate)


def _dropout_scale(p):
    return np.float32(1.0 / (1.0 - p) if p < 1.0 else 0.0)


def dropout_threshold(p):
    """The integer form of ``uniform >= p``: ``(z >> 11) * 2**-53 >= p`` iff ``(z >> 11) >= ceil(p * 2**53)``."""
    return np.uint64(math.ceil(float(p) * 2.0 ** 53))


def dropout_forward(launcher, x, y, mask, p, seed, step):
    """Inverted dropout; ``step`` is a 1-element int32 device array (the per-step counter)."""
    launcher.launch(_dropout_forward, *grid_1d(x.size), flat(x), flat(y), flat(mask),
                    np.uint64(seed % 2 ** 64), dropout_threshold(p), _dropout_scale(p), step)


def dropout_backward(launcher, mask, dy, dx, p, accumulate):
    launcher.launch(_dropout_backward, *grid_1d(dy.size), flat(mask), flat(dy), flat(dx),
                    _dropout_scale(p), np.int32(accumulate))


@kernel("cast_f32_to_f16", (F1, H1))
def _cast_f32_to_f16(src, dst):
    for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
        dst[i] = f16(src[i])


def cast_f32_to_f16(launcher, src, dst):
    """fp16 copies of the fp32 master parameters (one launch over the whole region)."""
    launcher.launch(_cast_f32_to_f16, *grid_1d(src.size), flat(src), flat(dst))


@kernel("fill_zero_u32", (W1,))
def _fill_zero_u32(x):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        x[i] = 0


@kernel("fill_zero_f16", (H1,))
def _fill_zero_f16(x):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        x[i] = f16(ZERO)


def fill_zero(launcher, x):
    """Zero a device array of any dtype (4-byte dtypes through a uint32 view)."""
    values = flat(x)
    if values.dtype.itemsize == 4:
        words = values.view(np.uint32)
        launcher.launch(_fill_zero_u32, *grid_1d(words.size), words)
    elif values.dtype == np.float16:
        launcher.launch(_fill_zero_f16, *grid_1d(values.size), values)
    elif values.dtype == np.uint8 and values.size % 4 == 0:
        words = values.view(np.uint32)
        launcher.launch(_fill_zero_u32, *grid_1d(words.size), words)
    else:
        raise TypeError(f"fill_zero: expects a 4-byte dtype, float16 or uint8 with size % 4 == 0, "
                        f"got {values.dtype} of size {values.size}")
