"""SGD and Adam/AdamW over one whole contiguous parameter region, as ``torch.optim`` defines them.

Scalars that do not depend on the element (``1 - beta``, bias corrections, step size) are
computed in float64 by the wrapper and rounded once to fp32, as torch computes them in
Python floats (``np.float32(1) - np.float32(0.999)`` is 1.3e-5 away from 0.001).
"""
import math

import numpy as np
from numba import njit, prange

from cpu_ref._misc import flat, partition, workers_for


@njit(cache=True, parallel=True)
def _sgd(p, g, buf, lr, momentum, one_minus_dampening, nesterov, weight_decay, first_step, nworkers):
    for t in prange(nworkers):
        lo, hi = partition(p.size, t, nworkers)
        pv, gv = p[lo:hi], g[lo:hi]
        bv = buf[lo:hi] if buf is not None else None
        for i in range(pv.size):
            d = gv[i] + weight_decay * pv[i]
            if bv is not None:
                b = d if first_step else momentum * bv[i] + one_minus_dampening * d
                bv[i] = b
                d = d + momentum * b if nesterov else b
            pv[i] -= lr * d


def sgd_step(p, g, buf, lr, momentum, dampening, nesterov, weight_decay, first_step):
    """``torch.optim.SGD``: coupled weight decay, momentum buffer ``buf`` (``None`` or unused without momentum)."""
    f32 = np.float32
    _sgd(flat(p), flat(g), flat(buf) if momentum != 0 else None, f32(lr), f32(momentum), f32(1.0 - dampening),
         bool(nesterov), f32(weight_decay), bool(first_step), workers_for(p.size))


@njit(cache=True, parallel=True)
def _adam(p, g, m, v, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, decay_factor, step_size,
          sqrt_bias2, nworkers):
    for t in prange(nworkers):
        lo, hi = partition(p.size, t, nworkers)
        pv, gv, mv, vv = p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
        for i in range(pv.size):
            pi = pv[i] * decay_factor
            gi = gv[i] + weight_decay * pi
            mi = beta1 * mv[i] + one_minus_beta1 * gi
            vi = beta2 * vv[i] + one_minus_beta2 * gi * gi
            mv[i] = mi
            vv[i] = vi
            pv[i] = pi - step_size * (mi / (np.sqrt(vi) / sqrt_bias2 + eps))


def adam_step(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step, decoupled):
    """``torch.optim.Adam`` (coupled weight decay) or ``AdamW`` (``decoupled``); ``step`` counts from 1."""
    f32 = np.float32
    decay_factor = 1.0 - lr * weight_decay if decoupled else 1.0
    coupled_decay = 0.0 if decoupled else weight_decay
    _adam(flat(p), flat(g), flat(m), flat(v), f32(beta1), f32(1.0 - beta1), f32(beta2), f32(1.0 - beta2), f32(eps),
          f32(coupled_decay), f32(decay_factor), f32(lr / (1.0 - beta1 ** step)), f32(math.sqrt(1.0 - beta2 ** step)),
          workers_for(p.size))
