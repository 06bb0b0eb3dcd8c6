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
``growth_interval`` clean steps in a row; ``advance_counters`` counts the step (a recorded step runs the two
as one launch, ``finish_step``).

Where the region's length is a multiple of 4 and every array is 16-byte aligned, the ``_vec4`` kernels move
4 fp32 per access (``cuda_kernels.vector``), through the same per-element update as the scalar ones.
"""
import math

import numpy as np
from numba import cuda

from .elementwise import fill_zero
from .registry import F1, F32, I1, I32, ONE, ZERO, kernel, nbt
from .vector import VEC4, launch_flat, load4, store4

f32, i32 = nbt.float32, nbt.int32
INIT_LOSS_SCALE, GROWTH_FACTOR, BACKOFF_FACTOR, GROWTH_INTERVAL = 2.0 ** 16, 2.0, 0.5, 2000


_SGD = (F1, F1, F1, F1, I1, F1, I1, F32, F32, I32, F32)
_ADAM = (F1, F1, F1, F1, F1, I1, F1, I1, F32, F32, F32, F32, I32)


@cuda.jit(device=True)
def _sgd(p, g, b, inv_scale, rate, first, momentum, dampening, nesterov, weight_decay):
    """One parameter's update: ``(new p, new momentum buffer)``."""
    d = g * inv_scale + weight_decay * p
    if momentum != ZERO:
        b = d if first else momentum * b + (ONE - dampening) * d
        d = d + momentum * b if nesterov else b
    return p - rate * d, b


@kernel("sgd_step", _SGD)
def _sgd_step(p, g, buf, lr, step, loss_scale, found_inf, momentum, dampening, nesterov, weight_decay):
    if found_inf[0] != 0:
        return
    rate, inv_scale, first = lr[0], ONE / loss_scale[0], step[0] == 0
    for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
        p[i], b = _sgd(p[i], g[i], buf[i] if momentum != ZERO else ZERO, inv_scale, rate, first, momentum,
                       dampening, nesterov, weight_decay)
        if momentum != ZERO:
            buf[i] = b


@kernel("sgd_step_vec4", _SGD)
def _sgd_step_vec4(p, g, buf, lr, step, loss_scale, found_inf, momentum, dampening, nesterov, weight_decay):
    if found_inf[0] != 0:
        return
    rate, inv_scale, first = lr[0], ONE / loss_scale[0], step[0] == 0
    pv = cuda.local.array(VEC4, nbt.float32)
    gv = cuda.local.array(VEC4, nbt.float32)
    bv = cuda.local.array(VEC4, nbt.float32)
    for e in range(i32(cuda.grid(1)), i32(p.size // VEC4), i32(cuda.gridsize(1))):
        i = e * VEC4
        load4(pv, p, i)
        load4(gv, g, i)
        if momentum != ZERO:
            load4(bv, buf, i)
        for k in range(VEC4):
            pv[k], bv[k] = _sgd(pv[k], gv[k], bv[k], inv_scale, rate, first, momentum, dampening, nesterov,
                                weight_decay)
        store4(p, i, pv)
        if momentum != ZERO:
            store4(buf, i, bv)


@cuda.jit(device=True)
def _adam(pi, gi, mi, vi, inv_scale, rate, step_size, bias2_sqrt, beta1, beta2, eps, weight_decay, decoupled):
    """One parameter's update: ``(new p, new m, new v)``."""
    gi *= inv_scale
    if decoupled:
        pi *= ONE - rate * weight_decay
    else:
        gi += weight_decay * pi
    mi = beta1 * mi + (ONE - beta1) * gi
    vi = beta2 * vi + (ONE - beta2) * gi * gi
    return pi - step_size * mi / (math.sqrt(vi) / bias2_sqrt + eps), mi, vi


@cuda.jit(device=True)
def _adam_constants(lr, step, loss_scale, beta1, beta2):
    rate, inv_scale, t = lr[0], ONE / loss_scale[0], f32(step[0] + 1)
    return rate, inv_scale, rate / (ONE - math.pow(beta1, t)), math.sqrt(ONE - math.pow(beta2, t))


@kernel("adam_step", _ADAM)
def _adam_step(p, g, m, v, lr, step, loss_scale, found_inf, beta1, beta2, eps, weight_decay, decoupled):
    if found_inf[0] != 0:
        return
    rate, inv_scale, step_size, bias2_sqrt = _adam_constants(lr, step, loss_scale, beta1, beta2)
    for i in range(cuda.grid(1), p.size, cuda.gridsize(1)):
        p[i], m[i], v[i] = _adam(p[i], g[i], m[i], v[i], inv_scale, rate, step_size, bias2_sqrt, beta1, beta2, eps,
                                 weight_decay, decoupled)


@kernel("adam_step_vec4", _ADAM)
def _adam_step_vec4(p, g, m, v, lr, step, loss_scale, found_inf, beta1, beta2, eps, weight_decay, decoupled):
    if found_inf[0] != 0:
        return
    rate, inv_scale, step_size, bias2_sqrt = _adam_constants(lr, step, loss_scale, beta1, beta2)
    pv = cuda.local.array(VEC4, nbt.float32)
    gv = cuda.local.array(VEC4, nbt.float32)
    mv = cuda.local.array(VEC4, nbt.float32)
    vv = cuda.local.array(VEC4, nbt.float32)
    for e in range(i32(cuda.grid(1)), i32(p.size // VEC4), i32(cuda.gridsize(1))):
        i = e * VEC4
        load4(pv, p, i)
        load4(gv, g, i)
        load4(mv, m, i)
        load4(vv, v, i)
        for k in range(VEC4):
            pv[k], mv[k], vv[k] = _adam(pv[k], gv[k], mv[k], vv[k], inv_scale, rate, step_size, bias2_sqrt, beta1,
                                        beta2, eps, weight_decay, decoupled)
        store4(p, i, pv)
        store4(m, i, mv)
        store4(v, i, vv)


@kernel("check_overflow", (F1, I1))
def _check_overflow(g, found_inf):
    for i in range(cuda.grid(1), g.size, cuda.gridsize(1)):
        if math.isinf(g[i]) or math.isnan(g[i]):
            found_inf[0] = 1   # every writer writes the same value


@kernel("check_overflow_vec4", (F1, I1))
def _check_overflow_vec4(g, found_inf):
    gv = cuda.local.array(VEC4, nbt.float32)
    for e in range(i32(cuda.grid(1)), i32(g.size // VEC4), i32(cuda.gridsize(1))):
        load4(gv, g, e * VEC4)
        for k in range(VEC4):
            if math.isinf(gv[k]) or math.isnan(gv[k]):
                found_inf[0] = 1


@cuda.jit(device=True)
def _scale_update(found_inf, loss_scale, growth_tracker, growth_factor, backoff_factor, growth_interval):
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


@cuda.jit(device=True)
def _count(found_inf, step, iteration):
    iteration[0] += 1
    if found_inf[0] == 0:
        step[0] += 1


@kernel("update_loss_scale", (I1, F1, I1, F32, F32, I32))
def _update_loss_scale(found_inf, loss_scale, growth_tracker, growth_factor, backoff_factor, growth_interval):
    if cuda.grid(1) == 0:
        _scale_update(found_inf, loss_scale, growth_tracker, growth_factor, backoff_factor, growth_interval)


@kernel("advance_counters", (I1, I1, I1))
def _advance_counters(found_inf, step, iteration):
    if cuda.grid(1) == 0:
        _count(found_inf, step, iteration)


@kernel("finish_step", (I1, F1, I1, I1, I1, F32, F32, I32))
def _finish_step(found_inf, loss_scale, growth_tracker, step, iteration, growth_factor, backoff_factor,
                 growth_interval):
    if cuda.grid(1) == 0:
        _scale_update(found_inf, loss_scale, growth_tracker, growth_factor, backoff_factor, growth_interval)
        _count(found_inf, step, iteration)


def sgd_step(launcher, p, g, buf, lr, step, loss_scale, found_inf, momentum, dampening, nesterov, weight_decay):
    """``torch.optim.SGD`` on ``g / loss_scale``; skipped entirely when ``found_inf[0]``."""
    launch_flat(launcher, _sgd_step, _sgd_step_vec4, VEC4, p.size, (p, g, buf), p, g, buf, lr, step, loss_scale,
                found_inf, np.float32(momentum), np.float32(dampening), np.int32(nesterov), np.float32(weight_decay))


def adam_step(launcher, p, g, m, v, lr, step, loss_scale, found_inf, beta1, beta2, eps, weight_decay, decoupled):
    """``torch.optim.Adam`` (``decoupled=False``) / ``AdamW`` on ``g / loss_scale``; skipped on overflow."""
    launch_flat(launcher, _adam_step, _adam_step_vec4, VEC4, p.size, (p, g, m, v), p, g, m, v, lr, step, loss_scale,
                found_inf, np.float32(beta1), np.float32(beta2), np.float32(eps), np.float32(weight_decay),
                np.int32(decoupled))


def check_overflow(launcher, g, found_inf):
    """``found_inf[0] = 1`` if any element of the gradient region is inf or nan, else 0."""
    fill_zero(launcher, found_inf)
    launch_flat(launcher, _check_overflow, _check_overflow_vec4, VEC4, g.size, (g,), g, found_inf)


def update_loss_scale(launcher, found_inf, loss_scale, growth_tracker, growth_factor=GROWTH_FACTOR,
                      backoff_factor=BACKOFF_FACTOR, growth_interval=GROWTH_INTERVAL):
    launcher.launch(_update_loss_scale, 1, 1, found_inf, loss_scale, growth_tracker,
                    np.float32(growth_factor), np.float32(backoff_factor), np.int32(growth_interval))


def advance_counters(launcher, found_inf, step, iteration):
    """``iteration += 1`` always (dropout draws per iteration); ``step += 1`` unless the update was skipped."""
    launcher.launch(_advance_counters, 1, 1, found_inf, step, iteration)


def finish_step(launcher, found_inf, loss_scale, growth_tracker, step, iteration, growth_factor=GROWTH_FACTOR,
                backoff_factor=BACKOFF_FACTOR, growth_interval=GROWTH_INTERVAL):
    """``update_loss_scale`` then ``advance_counters`` in one launch (a recorded step's last scalar work)."""
    launcher.launch(_finish_step, 1, 1, found_inf, loss_scale, growth_tracker, step, iteration,
                    np.float32(growth_factor), np.float32(backoff_factor), np.int32(growth_interval))
