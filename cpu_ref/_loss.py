"""Softmax cross-entropy with label smoothing: ``torch.nn.CrossEntropyLoss(label_smoothing=s)``, mean reduction.

The smoothed target is ``(1 - s) * onehot + s / K``; the loss of a row is
``-sum_k target_k * log_softmax_k``; the gradient of the mean loss is
``(softmax - target) / N``, scaled by ``grad_scale`` (the loss scale under AMP).
"""
import numpy as np
from numba import njit


@njit(cache=True)
def _softmax_cross_entropy(logits, labels, smoothing, dlogits, grad_scale):
    n, k = logits.shape
    off = smoothing / k
    on = 1.0 - smoothing + off
    total = 0.0
    for r in range(n):
        row = logits[r]
        top = row.max()
        sum_exp = 0.0
        sum_z = 0.0
        for j in range(k):
            z = np.float64(row[j]) - top
            sum_exp += np.exp(z)
            sum_z += z
        log_sum = np.log(sum_exp)
        label = labels[r]
        z_label = np.float64(row[label]) - top
        # -sum_j target_j * (z_j - log_sum), target summing to 1
        total += log_sum - (1.0 - smoothing) * z_label - off * sum_z
        if dlogits is not None:
            scale = grad_scale / n
            for j in range(k):
                prob = np.exp(np.float64(row[j]) - top - log_sum)
                dlogits[r, j] = scale * (prob - (on if j == label else off))
    return total / n


def softmax_cross_entropy(logits, labels, smoothing, dlogits, grad_scale):
    """Returns the mean loss (a Python float); writes ``dlogits`` unless it is ``None``."""
    return float(_softmax_cross_entropy(logits, labels, float(smoothing), dlogits, float(grad_scale)))
