"""Multi-tensor optimizers and dynamic loss scaling over whole contiguous fp32 regions.

One launch updates every parameter: ``p``, ``g`` and the state are the parameter,
gradient and state regions of the arena. Everything that changes per step is read from
1-element device arrays (arena slots), so a captured step replays without the host:
``lr`` (fp32), ``step`` (int32, optimizer steps completed so far: Adam's bias correction
uses ``step + 1``, SGD's first momentum step is ``step == 0``), ``loss_scale`` (fp32; the
gradients are ``loss_scale`` times the true ones) and ``found_inf`` (int32 flag).

Dynamic loss scaling is PyTorch's ``GradScaler``: ``check_overflow`` sets ``found_inf``
if any gradient is inf/nan; the optimizer then skips the whole update;
``update_loss_scale`` halves the scale on overflow and doubles it after
``growth_interval`` clean steps in a row; ``advance_counters`` counts the step.
"""
import math

import numpy as np
from numba import cuda

from .elementwise import fill_zero
from .registry import F1, F32, I1, I32, ONE, ZERO, grid_1d, kernel, nbt

f32 = nbt.float32
INIT_LOSS_SCALE, GROWTH_FACTOR, BACKOFF_FACTOR, GROWTH_INTERVAL = 2.0 ** 16, 2.0, 0.5, 2000


@kernel("sgd_step", (F1, F1, F1, F1, I1, F1, I1, F32, F32, I32, F32))
def _sgd_step(p, g, buf, lr, step, loss_scale, found_inf, momentum, dampening, nesterov, weight_decay):
    if found_inf[0] != 0:
        return
    rate, inv_scale, first = lr[0], ONE / loss_scale[0], step[0] == 0
    for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
        d = g[i] * inv_scale + weight_decay * p[i]
        if momentum != ZERO:
            b = d if first else momentum * buf[i] + (ONE - dampening) * d
            buf[i] = b
            d = d + momentum * b if nesterov else b
        p[i] -= rate * d


@kernel("adam_step", (F1, F1, F1, F1, F1, I1, F1, I1, F32, F32, F32, F32, I32))
def _adam_step(p, g, m, v, lr, step, loss_scale, found_inf, beta1, beta2, eps, weight_decay, decoupled):
    if found_inf[0] != 0:
        return
    rate, inv_scale, t = lr[0], ONE / loss_scale[0], f32(step[0] + 1)
    step_size = rate / (ONE - math.pow(beta1, t))
    bias2_sqrt = math.sqrt(ONE - math.pow(beta2, t))
    for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
        gi, pi = g[i] * inv_scale, p[i]
        if decoupled:
            pi *= ONE - rate * weight_decay
        else:
            gi += weight_decay * pi
        mi = beta1 * m[i] + (ONE - beta1) * gi
        vi = beta2 * v[i] + (ONE - beta2) * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] = pi - step_size * mi / (math.sqrt(vi) / bias2_sqrt + eps)


@kernel("check_overflow", (F1, I1))
def _check_overflow(g, found_inf):
    for i in range(cuda.grid(1), g.size, cuda.gridsize(1)):
        if math.isinf(g[i]) or math.isnan(g[i]):
            found_inf[0] = 1   # every writer writes the same value


@kernel("update_loss_scale", (I1, F1, I1, F32, F32, I32))
def _update_loss_scale(found_inf, loss_scale, growth_tracker, growth_factor, backoff_factor, growth_interval):
    if cuda.grid(1) == 0:
        if found_inf[0] != 0:
            loss_scale[0] *= backoff_factor
            growth_tracker[0] = 0
        elif growth_tracker[0] + 1 == growth_interval:
            grown = loss_scale[0] * growth_factor
            if not math.isinf(grown):
                loss_scale[0] = grown
            growth_tracker[0] = 0
        else:
            growth_tracker[0] += 1


@kernel("advance_counters", (I1, I1, I1))
def _advance_counters(found_inf, step, iteration):
    if cuda.grid(1) == 0:
        iteration[0] += 1
        if found_inf[0] == 0:
            step[0] += 1


def sgd_step(launcher, p, g, buf, lr, step, loss_scale, found_inf, momentum, dampening, nesterov, weight_decay):
    """``torch.optim.SGD`` on ``g / loss_scale``; skipped entirely when ``found_inf[0]``."""
    launcher.launch(_sgd_step, *grid_1d(p.size), p, g, buf, lr, step, loss_scale, found_inf,
                    np.float32(momentum), np.float32(dampening), np.int32(nesterov), np.float32(weight_decay))


def adam_step(launcher, p, g, m, v, lr, step, loss_scale, found_inf, beta1, beta2, eps, weight_decay, decoupled):
    """``torch.optim.Adam`` (``decoupled=False``) / ``AdamW`` on ``g / loss_scale``; skipped on overflow."""
    launcher.launch(_adam_step, *grid_1d(p.size), p, g, m, v, lr, step, loss_scale, found_inf,
                    np.float32(beta1), np.float32(beta2), np.float32(eps), np.float32(weight_decay),
                    np.int32(decoupled))


def check_overflow(launcher, g, found_inf):
    """``found_inf[0] = 1`` if any element of the gradient region is inf or nan, else 0."""
    fill_zero(launcher, found_inf)
    launcher.launch(_check_overflow, *grid_1d(g.size), g, found_inf)


def update_loss_scale(launcher, found_inf, loss_scale, growth_tracker, growth_factor=GROWTH_FACTOR,
                      backoff_factor=BACKOFF_FACTOR, growth_interval=GROWTH_INTERVAL):
    launcher.launch(_update_loss_scale, 1, 1, found_inf, loss_scale, growth_tracker,
                    np.float32(growth_factor), np.float32(backoff_factor), np.int32(growth_interval))


def advance_counters(launcher, found_inf, step, iteration):
    """``iteration += 1`` always (dropout draws per iteration); ``step += 1`` unless the update was skipped."""
    launcher.launch(_advance_counters, 1, 1, found_inf, step, iteration)
