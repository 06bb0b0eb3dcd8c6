"""SGD and Adam/AdamW over one whole contiguous parameter region, as ``torch.optim`` defines them.

Scalars that do not depend on the element (``1 - beta``, bias corrections, step size) are
computed in float64 by the wrapper and rounded once to fp32, as torch computes them in
Python floats (``np.float32(1) - np.float32(0.999)`` is 1.3e-5 away from 0.001).
"""
import math

import numpy as np
from numba import njit, prange

from cpu_ref._misc import flat, partition, run_split


@njit(cache=True)
def _sgd_span(p, g, buf, lr, momentum, one_minus_dampening, nesterov, weight_decay, first_step, t, nparts):
    """Without momentum ``buf`` is empty."""
    lo, hi = partition(p.size, t, nparts)
    p, g, buf = p[lo:hi], g[lo:hi], buf[lo:hi]
    if buf.size == 0:
        for i in range(p.size):
            p[i] -= lr * (g[i] + weight_decay * p[i])
        return
    for i in range(p.size):
        d = g[i] + weight_decay * p[i]
        b = d if first_step else momentum * buf[i] + one_minus_dampening * d
        buf[i] = b
        d = d + momentum * b if nesterov else b
        p[i] -= lr * d


@njit(cache=True, parallel=True)
def _sgd_parallel(p, g, buf, lr, momentum, one_minus_dampening, nesterov, weight_decay, first_step, nparts):
    for t in prange(nparts):
        _sgd_span(p, g, buf, lr, momentum, one_minus_dampening, nesterov, weight_decay, first_step, t, nparts)


_NO_BUFFER = np.zeros(0, np.float32)


def sgd_step(p, g, buf, lr, momentum, dampening, nesterov, weight_decay, first_step):
    """``torch.optim.SGD``: coupled weight decay, momentum buffer ``buf`` (``None`` or unused without momentum)."""
    f32 = np.float32
    run_split(_sgd_span, _sgd_parallel, p.size, flat(p), flat(g), flat(buf) if momentum != 0 else _NO_BUFFER, f32(lr),
              f32(momentum), f32(1.0 - dampening), bool(nesterov), f32(weight_decay), bool(first_step))


@njit(cache=True)
def _adam_span(p, g, m, v, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, decay_factor,
               step_size, sqrt_bias2, t, nparts):
    lo, hi = partition(p.size, t, nparts)
    p, g, m, v = p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
    for i in range(p.size):
        pi = p[i] * decay_factor
        gi = g[i] + weight_decay * pi
        mi = beta1 * m[i] + one_minus_beta1 * gi
        vi = beta2 * v[i] + one_minus_beta2 * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] = pi - step_size * (mi / (np.sqrt(vi) / sqrt_bias2 + eps))


@njit(cache=True, parallel=True)
def _adam_parallel(p, g, m, v, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, decay_factor,
                   step_size, sqrt_bias2, nparts):
    for t in prange(nparts):
        _adam_span(p, g, m, v, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, decay_factor,
                   step_size, sqrt_bias2, t, nparts)


def adam_step(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step, decoupled):
    """``torch.optim.Adam`` (coupled weight decay) or ``AdamW`` (``decoupled``); ``step`` counts from 1."""
    f32 = np.float32
    decay_factor = 1.0 - lr * weight_decay if decoupled else 1.0
    coupled_decay = 0.0 if decoupled else weight_decay
    run_split(_adam_span, _adam_parallel, p.size, flat(p), flat(g), flat(m), flat(v), f32(beta1), f32(1.0 - beta1),
              f32(beta2), f32(1.0 - beta2), f32(eps), f32(coupled_decay), f32(decay_factor),
              f32(lr / (1.0 - beta1 ** step)), f32(math.sqrt(1.0 - beta2 ** step)))
