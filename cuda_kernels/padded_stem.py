"""The stem on the aligned tensor-core path (issue 23, item 3): its fp16 weight copy with zero columns.

Under AMP the network input's slot has its channels padded to a multiple of 8 (``planner.expand``);
the host uploads the batch with its real channels (slot ``input_unpadded``) and the step's first kernel
writes it into the padded slot, zeros in the padded channels (``elementwise.channel_pad_forward``, inside
the recorded step, so graph replay repeats it). A convolution reading it (the
stem: 3 channels, 7x7 or 3x3) then takes the aligned kernels like every other layer, with an fp16
weight copy of as many channels (``ParamSpec.half_padded``), the extra columns zero. Only that copy
is padded: the fp32 master weight, its gradient (the weight-gradient kernel leaves the padded columns
out, ``mma_wgrad``), the optimizer state, checkpoints and ``state_dict`` keep the real channels.

The copies are written by the one launch that casts the master weights to fp16: the region's
8-element vectors first, then the padded copy's vectors (each re-writes its zero columns).
"""
import numpy as np
from numba import cuda

from .registry import F1, H1, I32, ZERO, flat, kernel, nbt
from .vector import VEC8, grid_vectors, ld_global_f32x4, store8, vectorisable

f32, i32 = nbt.float32, nbt.int32


@cuda.jit(device=True)
def _padded(w, row, c, channels):
    """``w[row, c]`` of the (rows, channels) master weight, 0 in the padded columns."""
    return f32(w[row * channels + c]) if c < channels else ZERO


@kernel("cast_f32_to_f16_padded_stem", (F1, H1, F1, H1, I32, I32))
def _cast_f32_to_f16_padded_stem(src, dst, w, w16, channels, padded):
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


def cast_with_padded_stems(launcher, params, weights16, stems):
    """The fp16 copies of every master weight (``params`` -> ``weights16``, element for element) and the padded
    copies ``stems`` = ((master, padded copy), ...), in one launch per stem (the zoo has one)."""
    if not vectorisable(params.size, VEC8, params, weights16):
        raise ValueError(f"cast_with_padded_stems: the parameter region ({params.size} fp32) is not a whole number "
                         f"of 16-byte-aligned 8-element vectors (planner.memory aligns every parameter to 512 bytes)")
    for k, (w, w16) in enumerate(stems):
        src, dst = (params, weights16) if k == 0 else (params[:0], weights16[:0])
        channels, padded = tuple(w.shape)[-1], tuple(w16.shape)[-1]
        vectors = src.size // VEC8 + w16.size // VEC8
        launcher.launch(_cast_f32_to_f16_padded_stem, *grid_vectors(vectors), src, dst, flat(w), flat(w16),
                        np.int32(channels), np.int32(padded))
