"""Softmax cross-entropy with label smoothing (``torch.nn.CrossEntropyLoss``, mean reduction).

One block per sample row: block reductions (shared memory, no warp shuffles, so the
simulator runs it) find the row max, ``sum(exp)`` and ``sum(z)``. With
``z = logits - max`` and ``lse = log(sum(exp(z)))`` the row loss is
``-((1 - s) * (z[label] - lse) + (s / K) * (sum(z) - K * lse))``; each row adds
``loss_row / N`` atomically into the device scalar ``loss`` (zeroed first). The gradient is
``dlogits = grad_scale[0] / N * (softmax - target)``, ``grad_scale`` being the device loss scale.
"""
import math

import numpy as np
from numba import cuda

from .elementwise import fill_zero
from .registry import F1, F32, H1, I1, I32, ONE, SIMULATOR, ZERO, grid_1d, kernel, nbt

f16, f32 = nbt.float16, nbt.float32
ROW_THREADS = 32 if SIMULATOR else 128   # a power of two
_NEG_INF = np.float32(-np.inf)


@cuda.jit(device=True)
def _block_reduce(red, v, is_max):
    t = cuda.threadIdx.x
    red[t] = v
    cuda.syncthreads()
    half = ROW_THREADS // 2
    while half > 0:
        if t < half:
            red[t] = max(red[t], red[t + half]) if is_max else red[t] + red[t + half]
        cuda.syncthreads()
        half //= 2
    total = red[0]
    cuda.syncthreads()   # ``red`` is reused by the next reduction
    return total


@kernel("softmax_cross_entropy", (H1, I1, F1, H1, F1, F32, I32, I32))
def _softmax_cross_entropy(logits, labels, loss, dlogits, grad_scale, smoothing, classes, write_grad):
    red = cuda.shared.array(ROW_THREADS, nbt.float32)
    row, t = cuda.blockIdx.x, cuda.threadIdx.x
    rows = logits.size // classes
    base = row * classes
    top = _NEG_INF
    for j in range(t, classes, ROW_THREADS):
        top = max(top, f32(logits[base + j]))
    top = _block_reduce(red, top, True)
    sum_exp, sum_z = ZERO, ZERO
    for j in range(t, classes, ROW_THREADS):
        z = f32(logits[base + j]) - top
        sum_exp += math.exp(z)
        sum_z += z
    sum_exp = _block_reduce(red, sum_exp, False)
    sum_z = _block_reduce(red, sum_z, False)
    lse = math.log(sum_exp)
    label = labels[row]
    k = f32(classes)
    if t == 0:
        z_label = f32(logits[base + label]) - top
        row_loss = -((ONE - smoothing) * (z_label - lse) + smoothing / k * (sum_z - k * lse))
        cuda.atomic.add(loss, 0, row_loss / f32(rows))
    if write_grad:
        scale = grad_scale[0] / f32(rows)
        for j in range(t, classes, ROW_THREADS):
            target = smoothing / k + (ONE - smoothing if j == label else ZERO)
            prob = math.exp(f32(logits[base + j]) - top - lse)
            dlogits[base + j] = f16(scale * (prob - target))


def softmax_cross_entropy(launcher, logits, labels, smoothing, loss, dlogits=None, grad_scale=None):
    """Mean loss into the fp32 device scalar ``loss`` (1 element).

    With ``dlogits`` (fp16, like ``logits``) also ``grad_scale[0] * d(mean loss)/d(logits)``;
    ``grad_scale`` is a 1-element fp32 device array (the dynamic loss scale).
    """
    rows, classes = logits.shape
    if (dlogits is None) != (grad_scale is None):
        raise ValueError("softmax_cross_entropy: pass dlogits and grad_scale together (training) or neither (eval)")
    fill_zero(launcher, loss)
    logits_1d = logits.reshape(logits.size)
    # Without a gradient the kernel never touches its dlogits / grad_scale arguments.
    launcher.launch(_softmax_cross_entropy, rows, ROW_THREADS, logits_1d, labels, loss,
                    logits_1d if dlogits is None else dlogits.reshape(dlogits.size),
                    loss if grad_scale is None else grad_scale,
                    np.float32(smoothing), np.int32(classes), np.int32(dlogits is not None))


@kernel("count_correct", (H1, I1, I1, I32))
def _count_correct(logits, labels, correct, classes):
    """``correct[0] += 1`` for each row whose first maximal logit is its label (numpy's argmax)."""
    for row in range(cuda.grid(1), logits.size // classes, cuda.gridsize(1)):
        base = row * classes
        best, best_j = f32(logits[base]), 0
        for j in range(1, classes):
            v = f32(logits[base + j])
            if v > best:
                best, best_j = v, j
        if best_j == labels[row]:
            cuda.atomic.add(correct, 0, 1)


def count_correct(launcher, logits, labels, correct):
    """``correct[0]`` (int32, zeroed first) = the number of rows whose argmax is the label."""
    rows, classes = logits.shape
    fill_zero(launcher, correct)
    launcher.launch(_count_correct, *grid_1d(rows), logits.reshape(logits.size), labels, correct, np.int32(classes))
