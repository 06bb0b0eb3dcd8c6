"""drop_path (stochastic depth) on fp16 views: sample ``n`` is kept iff the dropout stream's draw ``n``
(``planner.reference.dropout_uniform(seed, step, n)``, in uint64 only: bit-exact) is >= p; kept
samples are scaled by 1 / (1 - p). The keep flags (uint8, one per sample) are saved for backward.
"""
import numpy as np
from numba import cuda

from .elementwise import _GOLDEN, _S11, _U1, _dropout_scale, _mix64, _store, dropout_threshold
from .registry import B1, F32, H1, I1, I32, U64, ZERO, flat, grid_1d, kernel, nbt

f16, f32, u64 = nbt.float16, nbt.float32, nbt.uint64


@kernel("drop_path_forward", (H1, H1, B1, U64, U64, F32, I1))
def _drop_path_forward(x, y, mask, seed, threshold, scale, step):
    key = _mix64(seed * _GOLDEN + u64(step[0]))
    per_sample = x.size // mask.size
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        n = i // per_sample
        keep = (_mix64(key + (u64(n) + _U1) * _GOLDEN) >> _S11) >= threshold
        if i % per_sample == 0:
            mask[n] = 1 if keep else 0
        y[i] = f16(f32(x[i]) * scale) if keep else f16(ZERO)


@kernel("drop_path_backward", (B1, H1, H1, F32, I32))
def _drop_path_backward(mask, dy, dx, scale, accumulate):
    per_sample = dy.size // mask.size
    for i in range(cuda.grid(1), dy.size, cuda.gridsize(1)):
        _store(dx, i, f32(dy[i]) * scale if mask[i // per_sample] else ZERO, accumulate)


def drop_path_forward(launcher, x, y, mask, p, seed, step):
    """``step`` is a 1-element int32 device array (the per-step counter)."""
    launcher.launch(_drop_path_forward, *grid_1d(x.size), flat(x), flat(y), flat(mask), np.uint64(seed % 2 ** 64),
                    dropout_threshold(p), _dropout_scale(p), step)


def drop_path_backward(launcher, mask, dy, dx, p, accumulate):
    launcher.launch(_drop_path_backward, *grid_1d(dy.size), flat(mask), flat(dy), flat(dx), _dropout_scale(p),
                    np.int32(accumulate))
