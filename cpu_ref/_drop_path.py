"""drop_path (stochastic depth, torchvision's ``StochasticDepth(p, "row")``), training mode.

Sample ``n`` is kept iff ``reference.dropout_uniform(seed, step, n) >= p`` (the dropout stream
indexed by sample instead of element); kept samples are scaled by ``1 / (1 - p)``. The keep
flags (uint8, one per sample) are saved for backward. Eval mode is a copy (the executor's).
"""
import numpy as np
from numba import njit, prange

from cpu_ref._misc import _GOLDEN, _MASK64, _dropout_scale, _mix64, _uniform, flat, partition, run_split


@njit(cache=True)
def _mask(mask, p, seed, step):
    key = _mix64(seed * _GOLDEN + step)
    for n in range(mask.size):
        mask[n] = _uniform(key, n) >= p


@njit(cache=True)
def _scale_span(mask, x, y, scale, accumulate, t, nparts):
    """``y[n] = x[n] * scale * mask[n]`` (+ ``y[n]`` when accumulating), over flat per-sample rows."""
    lo, hi = partition(x.size, t, nparts)
    per_sample = x.size // mask.size
    for i in range(lo, hi):
        v = x[i] * scale if mask[i // per_sample] else np.float32(0.0)
        y[i] = v + (y[i] if accumulate else np.float32(0.0))


@njit(cache=True, parallel=True)
def _scale_parallel(mask, x, y, scale, accumulate, nparts):
    for t in prange(nparts):
        _scale_span(mask, x, y, scale, accumulate, t, nparts)


def drop_path_forward(x, y, mask, p, seed, step):
    """Writes the keep flags into ``mask`` (N,) and ``y = x * mask[n] / (1 - p)``."""
    _mask(mask, float(p), np.uint64(seed & _MASK64), np.uint64(step & _MASK64))
    run_split(_scale_span, _scale_parallel, x.size, mask, flat(x), flat(y), _dropout_scale(p), False)


def drop_path_backward(mask, dy, dx, p, accumulate):
    if dx is None:
        return
    run_split(_scale_span, _scale_parallel, dy.size, mask, flat(dy), flat(dx), _dropout_scale(p), accumulate)
