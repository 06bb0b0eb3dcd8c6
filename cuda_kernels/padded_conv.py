"""Convolutions with ``Cin % 8 != 0`` on the aligned tensor-core path (issue 23): their input and an fp16 weight
copy zero-padded to a multiple of 8 channels.

Under AMP the planner gives every groups-1 convolution whose input has ``Cin % 8 != 0`` an fp16 weight copy of
``8k`` channels, the extra columns zero (``ParamSpec.half_padded``, ``planner.schedule.padded_conv_positions``).
Its input is read padded with zero channels to match:

- the stem (every reader of the network input a groups-1 convolution): the input slot itself has the padded
  channels; the host uploads the batch with its real ones (slot ``input_unpadded``) and the step's first kernel
  writes it into the padded slot (``elementwise.channel_pad_forward``, inside the recorded step, so graph replay
  repeats it);
- any other such convolution (an interior layer of 12 channels, a stem whose input something else reads too):
  the op pads its input into a workspace of its own (``Role.X_PADDED``, forward and backward: re-padded there
  rather than kept alive from the forward), and its input gradient, if needed, is the aligned input gradient
  into that workspace, whose real channels are then written or added into ``dx``
  (``elementwise.channel_pad_backward``).

Then the aligned kernels run as for every other layer. Only the fp16 copy is padded: the fp32 master weight, its
gradient (the weight-gradient kernel leaves the padded columns out, ``mma_wgrad``), the optimizer state,
checkpoints and ``state_dict`` keep the real channels. Where the tensor-core backward does not take the padded
shapes (``Cout % 8 != 0``, an excluded tile) the backward runs the SIMT kernels on the real channels; a stem there
has no unpadded input to give them and raises.

The padded copies are written by the one launch that casts the master weights to fp16: the region's 8-element
vectors first, then the padded copy's vectors (each re-writes its zero columns).
"""
import numpy as np
from numba import cuda

from . import _conv, elementwise, mma_ops
from .registry import F1, H1, I32, ZERO, flat, kernel, nbt
from .vector import VEC8, grid_vectors, ld_global_f32x4, store8, vectorisable

f32, i32 = nbt.float32, nbt.int32


@cuda.jit(device=True)
def _padded(w, row, c, channels):
    """``w[row, c]`` of the (rows, channels) master weight, 0 in the padded columns."""
    return f32(w[row * channels + c]) if c < channels else ZERO


@kernel("cast_f32_to_f16_padded", (F1, H1, F1, H1, I32, I32))
def _cast_f32_to_f16_padded(src, dst, w, w16, channels, padded):
    """``dst = f16(src)`` by 8-element vectors, then ``w16[row, c] = f16(w[row, c])`` (0 for ``c >= channels``),
    ``w16`` (rows, padded) and ``padded % 8 == 0``: each of its vectors lies in one row."""
    vectors = i32(src.size // VEC8)
    for e in range(i32(cuda.grid(1)), vectors + i32(w16.size // VEC8), i32(cuda.gridsize(1))):
        if e < vectors:
            a0, a1, a2, a3 = ld_global_f32x4(src, e * VEC8)
            b0, b1, b2, b3 = ld_global_f32x4(src, e * VEC8 + 4)
            store8(dst, e * VEC8, (a0, a1, a2, a3, b0, b1, b2, b3))
        else:
            at = i32((e - vectors) * VEC8)
            row, c = i32(at // padded), i32(at % padded)
            store8(w16, at, (_padded(w, row, c, channels), _padded(w, row, c + 1, channels),
                             _padded(w, row, c + 2, channels), _padded(w, row, c + 3, channels),
                             _padded(w, row, c + 4, channels), _padded(w, row, c + 5, channels),
                             _padded(w, row, c + 6, channels), _padded(w, row, c + 7, channels)))


def cast_with_padded_weights(launcher, params, weights16, padded):
    """The fp16 copies of every master weight (``params`` -> ``weights16``, element for element) and the padded
    copies ``padded`` = ((master, padded copy), ...), in one launch per padded copy (the zoo has one: the stem)."""
    if not vectorisable(params.size, VEC8, params, weights16):
        raise ValueError(f"cast_with_padded_weights: the parameter region ({params.size} fp32) is not a whole number "
                         f"of 16-byte-aligned 8-element vectors (planner.memory aligns every parameter to 512 bytes)")
    for k, (w, w16) in enumerate(padded):
        src, dst = (params, weights16) if k == 0 else (params[:0], weights16[:0])
        channels, padded_channels = tuple(w.shape)[-1], tuple(w16.shape)[-1]
        vectors = src.size // VEC8 + w16.size // VEC8
        launcher.launch(_cast_f32_to_f16_padded, *grid_vectors(vectors), src, dst, flat(w), flat(w16),
                        np.int32(channels), np.int32(padded_channels))


def padded_forward_operands(launcher, x, w_padded, workspace):
    """``(x, w)`` for the forward: ``x`` written into ``workspace`` with zero channels (a stem's ``x`` is the padded
    input slot: no workspace) and the padded weight copy."""
    if workspace is None:
        return x, w_padded
    elementwise.channel_pad_forward(launcher, x, workspace)
    return workspace, w_padded


def conv2d_backward(launcher, x, w, w_padded, workspace, dy, dx, dw, stride, pad, accumulate):
    """``dw`` (fp32, real channels, overwritten) and ``dx`` (fp16, real channels, or None; overwritten or added
    into) of a padded convolution: ``x`` and ``w`` have the real channels (a stem's ``x`` the padded ones: then
    ``workspace`` is None and no ``dx`` is wanted)."""
    if workspace is None:   # a stem on the padded input slot
        if dx is not None:
            raise ValueError(f"padded_conv.conv2d_backward: the network input x {tuple(x.shape)} is read padded "
                             f"and needs no gradient, but a dx {tuple(dx.shape)} was given")
        mma_ops.conv2d_backward(launcher, x, w_padded, dy, None, dw, stride, pad, 1, False)
        return
    if not mma_ops.backward_ready(tuple(workspace.shape), tuple(w_padded.shape), stride, dx is not None):
        _conv.conv2d_backward(launcher, x, w, dy, dx, dw, stride, pad, 1, accumulate)   # SIMT, real channels
        return
    elementwise.channel_pad_forward(launcher, x, workspace)
    mma_ops.conv2d_backward(launcher, workspace, w_padded, dy, None if dx is None else workspace, dw, stride, pad,
                            1, False)   # the input gradient over the padded input, once the weight gradient read it
    if dx is not None:
        elementwise.channel_pad_backward(launcher, workspace, dx, accumulate)
