"""prelu: ``y = x`` where ``x > 0``, else ``w[c] * x``, with one learned slope per channel (the last axis)
or one shared by all (``w`` of size 1). Backward: ``dx = dy`` or ``w[c] * dy``, and
``dw[c] = sum of x * dy over the elements where x <= 0`` (fp32, summed in row order, one pass).
"""
import numpy as np
from numba import njit

_ZERO = np.float32(0.0)


@njit(cache=True)
def _forward(x, w, y):
    shared = w.size == 1
    for r in range(x.shape[0]):
        for c in range(x.shape[1]):
            v = x[r, c]
            y[r, c] = v if v > _ZERO else w[0 if shared else c] * v


@njit(cache=True)
def _backward(x, w, dy, dx, dw, want_dx, accumulate):
    shared = w.size == 1
    dw[:] = _ZERO
    for r in range(x.shape[0]):
        for c in range(x.shape[1]):
            v, g = x[r, c], dy[r, c]
            k = 0 if shared else c
            if v > _ZERO:
                d = g
            else:
                d = w[k] * g
                dw[k] += v * g
            if want_dx:
                dx[r, c] = d + (dx[r, c] if accumulate else _ZERO)


def _rows(a):
    return a.reshape(-1, a.shape[-1])


def prelu_forward(x, w, y):
    _forward(_rows(x), w, _rows(y))


def prelu_backward(x, w, dy, dx, dw, accumulate):
    """``dx`` may be None (the first layer's input needs no gradient); ``dw`` is overwritten."""
    rows = _rows(x)
    _backward(rows, w, _rows(dy), rows if dx is None else _rows(dx), dw, dx is not None, accumulate)
