"""Elementwise kernels on flat fp16 views: activations, add, channel pad, dropout, casts.

Every activation of the op table gets its two kernels here, compiled from its row's float32 scalar pair
(``planner/scalar_activations.py``, the bodies the CPU path compiles too); adding one touches nothing here.

Forward and backward of each primitive sit side by side. Every kernel is a grid-stride
loop, computes in fp32 and stores fp16; ``accumulate`` (int32 0/1) chooses between
overwriting ``dx`` and adding into it (the contract's gradient accumulation). Where the element
count is a multiple of the vector and the arrays are 16-byte aligned, the ``_vec8`` / ``_vec4`` twins move
8 fp16 or 4 fp32 per access (``cuda_kernels.vector``); dropout stays one element per thread (a hash per
element), the channel pad's forward stores 16 bytes (its input has fewer than 8 channels: read one by one) and
its backward stays one element per thread (a layer the planner rarely emits).
"""
import math
from typing import NamedTuple

import numpy as np
from numba import cuda

from planner.kernel_table import activation_kernels, activation_kernels_of
from planner.ops import ACTIVATION_SLOTS, OPS, OpRow

from .registry import B1, F1, F32, H1, I1, I32, U64, W1, ZERO, KernelSpec, flat, grid_1d, kernel, nbt
from .tape import device_span
from .vector import VEC4, VEC8, grid_vectors, launch_flat, ld_global_f32x4, load8, store4, store8, vectorisable

f16, f32, i32, u64 = nbt.float16, nbt.float32, nbt.int32, nbt.uint64


@cuda.jit(device=True)
def _store(dx, i, v, accumulate):
    if accumulate:
        v += f32(dx[i])
    dx[i] = f16(v)


@cuda.jit(device=True)
def _load8_or_zero(out, a, index, load):
    """``out = a[index:index + 8]`` if ``load`` else zeros (an overwritten or accumulated gradient)."""
    if load:
        load8(out, a, index)
    else:
        for k in range(VEC8):
            out[k] = ZERO


class _Pointwise(NamedTuple):
    forward: KernelSpec
    backward: KernelSpec
    f: object       # the row's scalar pair as device functions (the BN apply fuses relu and relu6 through them)
    grad: object
    forward_vec8: KernelSpec
    backward_vec8: KernelSpec


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

    def forward_vec8(x, y, a, b):
        v = cuda.local.array(VEC8, nbt.float32)
        for e in range(i32(cuda.grid(1)), i32(x.size // VEC8), i32(cuda.gridsize(1))):
            load8(v, x, e * VEC8)
            for k in range(VEC8):
                v[k] = f(v[k], a, b)
            store8(y, e * VEC8, v)

    def backward_vec8(saved, dy, dx, a, b, accumulate):
        s = cuda.local.array(VEC8, nbt.float32)
        g = cuda.local.array(VEC8, nbt.float32)
        out = cuda.local.array(VEC8, nbt.float32)
        for e in range(i32(cuda.grid(1)), i32(dy.size // VEC8), i32(cuda.gridsize(1))):
            load8(s, saved, e * VEC8)
            load8(g, dy, e * VEC8)
            _load8_or_zero(out, dx, e * VEC8, accumulate)
            for k in range(VEC8):
                out[k] += grad(s[k], g[k], a, b)
            store8(dx, e * VEC8, out)

    name = row.prim.value
    return _Pointwise(kernel(f"activation_forward.{name}", (H1, H1, F32, F32))(forward),
                      kernel(f"activation_backward.{name}", (H1, H1, H1, F32, F32, I32))(backward), f, grad,
                      kernel(f"activation_forward_vec8.{name}", (H1, H1, F32, F32))(forward_vec8),
                      kernel(f"activation_backward_vec8.{name}", (H1, H1, H1, F32, F32, I32))(backward_vec8))


ACTIVATION_KERNELS = activation_kernels(OPS, pointwise)   # Prim -> kernels, every activation row, in table order


def _kernels(prim):
    return activation_kernels_of(ACTIVATION_KERNELS, prim)   # reads the module's table when called


def _slots(params) -> tuple:
    """``params`` (the row's attrs' values, ``planner.ops.activation_params``) as the kernels' float32 slots."""
    return tuple(np.float32(v) for v in tuple(params) + (0.0,) * (ACTIVATION_SLOTS - len(params)))


def activation_forward(launcher, prim, x, y, params=()):
    """``y = act(x)``; ``params``: the activation's parameters in its row's ``attrs`` order."""
    k = _kernels(prim)
    launch_flat(launcher, k.forward, k.forward_vec8, VEC8, x.size, (x, y), flat(x), flat(y), *_slots(params))


def activation_backward(launcher, prim, saved, dy, dx, params=(), accumulate=False):
    k = _kernels(prim)
    launch_flat(launcher, k.backward, k.backward_vec8, VEC8, dy.size, (saved, dy, dx), flat(saved), flat(dy),
                flat(dx), *_slots(params), np.int32(accumulate))


@kernel("add_forward", (H1, H1, H1))
def _add_forward(a, b, y):
    for i in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        y[i] = f16(f32(a[i]) + f32(b[i]))


@kernel("accumulate_into", (H1, H1, I32))
def _accumulate_into(dst, src, accumulate):
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        _store(dst, i, f32(src[i]), accumulate)


@kernel("add_forward_vec8", (H1, H1, H1))
def _add_forward_vec8(a, b, y):
    u = cuda.local.array(VEC8, nbt.float32)
    v = cuda.local.array(VEC8, nbt.float32)
    for e in range(i32(cuda.grid(1)), i32(y.size // VEC8), i32(cuda.gridsize(1))):
        load8(u, a, e * VEC8)
        load8(v, b, e * VEC8)
        for k in range(VEC8):
            u[k] += v[k]
        store8(y, e * VEC8, u)


@kernel("accumulate_into_vec8", (H1, H1, I32))
def _accumulate_into_vec8(dst, src, accumulate):
    u = cuda.local.array(VEC8, nbt.float32)
    v = cuda.local.array(VEC8, nbt.float32)
    for e in range(i32(cuda.grid(1)), i32(dst.size // VEC8), i32(cuda.gridsize(1))):
        _load8_or_zero(u, dst, e * VEC8, accumulate)
        load8(v, src, e * VEC8)
        for k in range(VEC8):
            u[k] += v[k]
        store8(dst, e * VEC8, u)


def add_forward(launcher, a, b, y):
    launch_flat(launcher, _add_forward, _add_forward_vec8, VEC8, y.size, (a, b, y), flat(a), flat(b), flat(y))


def accumulate_into(launcher, dst, src, accumulate):
    """``dst = src`` or ``dst += src`` (the backward of a residual add)."""
    launch_flat(launcher, _accumulate_into, _accumulate_into_vec8, VEC8, dst.size, (dst, src), flat(dst), flat(src),
                np.int32(accumulate))


@kernel("channel_pad_forward", (H1, H1, I32, I32))
def _channel_pad_forward(x, y, c_in, c_out):
    for i in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        c = i % c_out
        y[i] = x[(i // c_out) * c_in + c] if c < c_in else f16(ZERO)


@kernel("channel_pad_backward", (H1, H1, I32, I32, I32))
def _channel_pad_backward(dy, dx, c_in, c_out, accumulate):
    for i in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
        _store(dx, i, f32(dy[(i // c_in) * c_out + i % c_in]), accumulate)


@cuda.jit(device=True)
def _channel_or_zero(x, at, c, c_in):
    """``x[at + c]`` (a pixel's channel ``c``) for ``c < c_in``, else 0: a padded channel reads nothing."""
    return f32(x[at + c]) if c < c_in else ZERO


@kernel("channel_pad_forward_vec8", (H1, H1, I32, I32))
def _channel_pad_forward_vec8(x, y, c_in, c_out):
    """``_channel_pad_forward`` by 16-byte stores, ``c_out % 8 == 0``: one pixel per thread and step, its ``c_out / 8``
    vectors written whole (the real channels read one by one: ``c_in`` fp16 a pixel, 6 bytes for RGB, no vector;
    the padded ones not read). No per-element division: the grid strides over pixels."""
    vectors = i32(c_out // VEC8)
    for p in range(i32(cuda.grid(1)), i32(y.size // c_out), i32(cuda.gridsize(1))):
        at, out = i32(p * c_in), i32(p * c_out)
        for v in range(vectors):
            c = i32(v * VEC8)
            store8(y, out + c, (_channel_or_zero(x, at, c, c_in), _channel_or_zero(x, at, c + 1, c_in),
                                _channel_or_zero(x, at, c + 2, c_in), _channel_or_zero(x, at, c + 3, c_in),
                                _channel_or_zero(x, at, c + 4, c_in), _channel_or_zero(x, at, c + 5, c_in),
                                _channel_or_zero(x, at, c + 6, c_in), _channel_or_zero(x, at, c + 7, c_in)))


def channel_pad_forward(launcher, x, y):
    """Copy ``x`` into the first channels (last axis) of ``y``; zeros in the new ones. By 16-byte stores where
    ``y``'s channels are a multiple of 8 and it is 16-byte aligned (the network input padded for the stem's aligned
    GEMMs, ``CudaExecutor``; a ``channel_padding(8 k)`` layer), one pixel per thread."""
    c_in, c_out = tuple(x.shape)[-1], tuple(y.shape)[-1]
    if vectorisable(c_out, VEC8, y):
        launcher.launch(_channel_pad_forward_vec8, *grid_vectors(y.size // c_out), flat(x), flat(y),
                        np.int32(c_in), np.int32(c_out))
    else:
        launcher.launch(_channel_pad_forward, *grid_1d(y.size), flat(x), flat(y), np.int32(c_in), np.int32(c_out))


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


@kernel("cast_f32_to_f16_vec8", (F1, H1))
def _cast_f32_to_f16_vec8(src, dst):
    for e in range(i32(cuda.grid(1)), i32(src.size // VEC8), i32(cuda.gridsize(1))):
        a0, a1, a2, a3 = ld_global_f32x4(src, e * VEC8)
        b0, b1, b2, b3 = ld_global_f32x4(src, e * VEC8 + VEC4)
        store8(dst, e * VEC8, (a0, a1, a2, a3, b0, b1, b2, b3))


def cast_f32_to_f16(launcher, src, dst):
    """fp16 copies of the fp32 master parameters (one launch over the whole region)."""
    launch_flat(launcher, _cast_f32_to_f16, _cast_f32_to_f16_vec8, VEC8, src.size, (src, dst), flat(src), flat(dst))


@kernel("fill_zero_u32", (W1,))
def _fill_zero_u32(x):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        x[i] = 0


@kernel("fill_zero_f16", (H1,))
def _fill_zero_f16(x):
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        x[i] = f16(ZERO)


@kernel("fill_zero_u32_vec4", (W1,))
def _fill_zero_u32_vec4(x):
    for e in range(i32(cuda.grid(1)), i32(x.size // VEC4), i32(cuda.gridsize(1))):
        store4(x, e * VEC4, (ZERO, ZERO, ZERO, ZERO))   # 0.0f is the word 0


def _fill_words(launcher, words):
    launch_flat(launcher, _fill_zero_u32, _fill_zero_u32_vec4, VEC4, words.size, (words,), words)


def fill_zero(launcher, x):
    """Zero a device array of any dtype (4-byte dtypes and fp16 with an even size through a uint32 view)."""
    values = flat(x)
    if values.dtype.itemsize == 4 or (values.dtype == np.uint8 and values.size % 4 == 0) or (
            values.dtype == np.float16 and values.size % 2 == 0 and device_span(values)[0] % 4 == 0):
        _fill_words(launcher, values.view(np.uint32))
    elif values.dtype == np.float16:
        launcher.launch(_fill_zero_f16, *grid_1d(values.size), values)
    else:
        raise TypeError(f"fill_zero: expects a 4-byte dtype, float16 or uint8 with size % 4 == 0, "
                        f"got {values.dtype} of size {values.size}")
