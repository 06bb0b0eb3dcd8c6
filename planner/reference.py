"""The specification of every primitive in docs/kernel-contract.md, in plain numpy.

Every row of the op table (``planner.ops.OPS``) points at its forward and backward here. This
module is the spec: the numba CPU kernels (``cpu_ref``) and the numba.cuda kernels
(``cuda_kernels``) are tested against it, and it is tested against float64 finite
differences and against PyTorch. It is written for clarity, not speed, and works in
whatever float dtype it is given (float64 for gradient checks).

Unlike the kernels, these functions *return* their results instead of writing into
given buffers, and have no ``accumulate`` flag (accumulating is ``dx += ...`` at the
call site). Layouts are those of the contract: activations NHWC, conv weights OHWI
``(Cout, KH, KW, Cin // groups)``, FC weights ``(out, in)``, BN on the 2-D view ``(M, C)``.
Forward and backward of a primitive sit side by side.
"""
import numpy as np

def conv_output_size(size, k, stride, pad):
    """Output extent of a convolution or pooling window along one axis (floor mode)."""
    return (size + 2 * pad - k) // stride + 1


# ---------------------------------------------------------------------------- conv2d

def im2col(x, kh, kw, stride, pad):
    """Patches of NHWC ``x`` as ``(N, OH, OW, KH, KW, C)``; zero padding."""
    n, h, w, c = x.shape
    oh, ow = conv_output_size(h, kh, stride, pad), conv_output_size(w, kw, stride, pad)
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    cols = np.empty((n, oh, ow, kh, kw, c), x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, :, i, j, :] = xp[:, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride, :]
    return cols


def col2im(cols, x_shape, stride, pad):
    """Adjoint of ``im2col``: scatter-add patch gradients back onto NHWC."""
    n, h, w, c = x_shape
    _, oh, ow, kh, kw, _ = cols.shape
    dxp = np.zeros((n, h + 2 * pad, w + 2 * pad, c), cols.dtype)
    for i in range(kh):
        for j in range(kw):
            dxp[:, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride, :] += cols[:, :, :, i, j, :]
    return dxp[:, pad:pad + h, pad:pad + w, :]


def conv2d_forward(x, w, stride, pad, groups):
    """``y[n,oh,ow,o] = sum_{i,j,c} xpad[n, oh*s+i, ow*s+j, g*Cin_g+c] * w[o,i,j,c]``, g = o // Cout_g."""
    cout, kh, kw, cin_g = w.shape
    cout_g = cout // groups
    cols = im2col(x, kh, kw, stride, pad)
    ys = [np.einsum("nhwijc,oijc->nhwo", cols[..., g * cin_g:(g + 1) * cin_g], w[g * cout_g:(g + 1) * cout_g])
          for g in range(groups)]
    return np.concatenate(ys, axis=-1)


def conv2d_backward(x, w, dy, stride, pad, groups):
    """Returns ``(dx, dw)``."""
    cout, kh, kw, cin_g = w.shape
    cout_g = cout // groups
    cols = im2col(x, kh, kw, stride, pad)
    dcols = np.empty_like(cols)
    dw = np.empty_like(w)
    for g in range(groups):
        cs, os_ = slice(g * cin_g, (g + 1) * cin_g), slice(g * cout_g, (g + 1) * cout_g)
        dw[os_] = np.einsum("nhwo,nhwijc->oijc", dy[..., os_], cols[..., cs])
        dcols[..., cs] = np.einsum("nhwo,oijc->nhwijc", dy[..., os_], w[os_])
    return col2im(dcols, x.shape, stride, pad), dw


# ---------------------------------------------------------------------------- batchnorm

def batchnorm_forward_train(x2d, gamma, beta, running_mean, running_var, momentum, eps):
    """Returns ``(y2d, save_mean, save_invstd, new_running_mean, new_running_var)``.

    Normalises with the biased batch variance; ``running_var`` moves toward the unbiased
    one (``M / (M - 1)``), ``running = (1 - momentum) * running + momentum * batch``.
    """
    m = x2d.shape[0]
    mean = x2d.mean(axis=0)
    var = ((x2d - mean) ** 2).mean(axis=0)
    invstd = 1.0 / np.sqrt(var + eps)
    y = (x2d - mean) * invstd * gamma + beta
    unbiased = var * (m / max(m - 1, 1))
    new_rm = (1 - momentum) * running_mean + momentum * mean
    new_rv = (1 - momentum) * running_var + momentum * unbiased
    return y, mean, invstd, new_rm, new_rv


def batchnorm_forward_eval(x2d, gamma, beta, running_mean, running_var, eps):
    return (x2d - running_mean) / np.sqrt(running_var + eps) * gamma + beta


def batchnorm_backward(x2d, gamma, save_mean, save_invstd, dy2d):
    """Returns ``(dx2d, dgamma, dbeta)`` of the training-mode forward."""
    m = x2d.shape[0]
    xhat = (x2d - save_mean) * save_invstd
    dbeta = dy2d.sum(axis=0)
    dgamma = (dy2d * xhat).sum(axis=0)
    dx = gamma * save_invstd / m * (m * dy2d - dbeta - xhat * dgamma)
    return dx, dgamma, dbeta


# ---------------------------------------------------------------------------- activations

def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _erf(x):
    from math import erf
    return np.vectorize(erf, otypes=[x.dtype])(x) if x.size else x.copy()


# Each activation is a pair ``f(x, *attrs) -> y`` and ``grad(saved, dy, *attrs) -> dx``, where
# ``saved`` is what its op-table row saves: the output ``y`` (relu, relu6, sigmoid, tanh) or the
# input ``x``; ``attrs`` are the row's parameters in its ``attrs`` order, with PyTorch's defaults
# (a kind without parameters ignores any).

def relu(x, alpha=0.01):
    return np.maximum(x, 0)


def relu_grad(y, dy, alpha=0.01):
    return np.where(y > 0, dy, 0)


def relu6(x, alpha=0.01):
    return np.clip(x, 0, 6)


def relu6_grad(y, dy, alpha=0.01):
    return np.where((y > 0) & (y < 6), dy, 0)


def leaky_relu(x, alpha=0.01):
    return np.where(x > 0, x, alpha * x)


def leaky_relu_grad(x, dy, alpha=0.01):
    return np.where(x > 0, dy, alpha * dy)


def sigmoid(x, alpha=0.01):
    return _sigmoid(x)


def sigmoid_grad(y, dy, alpha=0.01):
    return dy * y * (1 - y)


def tanh(x, alpha=0.01):
    return np.tanh(x)


def tanh_grad(y, dy, alpha=0.01):
    return dy * (1 - y * y)


def silu(x, alpha=0.01):
    return x * _sigmoid(x)


def silu_grad(x, dy, alpha=0.01):
    s = _sigmoid(x)
    return dy * s * (1 + x * (1 - s))


def hardswish(x, alpha=0.01):
    return x * np.clip(x + 3, 0, 6) / 6


def hardswish_grad(x, dy, alpha=0.01):
    return np.where(x < -3, 0, np.where(x <= 3, dy * (x / 3 + 0.5), dy))


def gelu(x, alpha=0.01):
    """The exact erf form (PyTorch's default)."""
    return 0.5 * x * (1 + _erf(x / np.sqrt(2.0)))


def gelu_grad(x, dy, alpha=0.01):
    cdf = 0.5 * (1 + _erf(x / np.sqrt(2.0)))
    pdf = np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)
    return dy * (cdf + x * pdf)


def hardsigmoid(x, alpha=0.01):
    return np.clip(x + 3, 0, 6) / 6


def hardsigmoid_grad(x, dy, alpha=0.01):
    """PyTorch's gradient: 1/6 strictly inside (-3, 3), else 0."""
    return np.where((x > -3) & (x < 3), dy / 6, 0)


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def elu(x, alpha=1.0, *_):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def elu_grad(x, dy, alpha=1.0, *_):
    return np.where(x > 0, dy, dy * alpha * np.exp(np.minimum(x, 0)))


def celu(x, alpha=1.0, *_):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0) / alpha))


def celu_grad(x, dy, alpha=1.0, *_):
    return np.where(x > 0, dy, dy * np.exp(np.minimum(x, 0) / alpha))


def selu(x, *_):
    return SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(np.minimum(x, 0)))


def selu_grad(x, dy, *_):
    return SELU_SCALE * np.where(x > 0, dy, dy * SELU_ALPHA * np.exp(np.minimum(x, 0)))


def softplus(x, beta=1.0, threshold=20.0):
    """log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (PyTorch's form)."""
    return np.where(x * beta > threshold, x, np.logaddexp(0, x * beta) / beta)


def softplus_grad(x, dy, beta=1.0, threshold=20.0):
    return np.where(x * beta > threshold, dy, dy * _sigmoid(x * beta))


def mish(x, *_):
    return x * np.tanh(np.logaddexp(0, x))


def mish_grad(x, dy, *_):
    t = np.tanh(np.logaddexp(0, x))
    return dy * (t + x * _sigmoid(x) * (1 - t * t))


def hardtanh(x, max_val=1.0, min_val=-1.0):
    return np.clip(x, min_val, max_val)


def hardtanh_grad(x, dy, max_val=1.0, min_val=-1.0):
    return np.where((x > min_val) & (x < max_val), dy, 0)


def prelu_forward(x, w):
    """x where positive, else w * x; ``w`` has one slope per channel (the last axis) or one for all."""
    return np.where(x > 0, x, w * x)


def prelu_backward(x, w, dy):
    """Returns ``(dx, dw)``; ``dw`` sums over every axis but the channel's (all of them for one slope)."""
    dx = np.where(x > 0, dy, w * dy)
    per_element = np.where(x > 0, 0, x * dy).reshape(-1, x.shape[-1])
    dw = per_element.sum(axis=0) if w.size > 1 else np.array([per_element.sum()])
    return dx, dw


# ---------------------------------------------------------------------------- pooling

def maxpool_forward(x, k, s, p):
    """Returns ``(y, argmax)``; ``-inf`` padding; the first maximum in (kh, kw) order wins.

    ``argmax`` is int32, the flat index ``(h * W + w) * C + c`` of the winner within its sample.
    """
    n, h, w, c = x.shape
    oh, ow = conv_output_size(h, k, s, p), conv_output_size(w, k, s, p)
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)), constant_values=-np.inf)
    y = np.full((n, oh, ow, c), -np.inf, x.dtype)
    argmax = np.zeros((n, oh, ow, c), np.int32)
    hh, ww, cc = np.meshgrid(np.arange(oh) * s, np.arange(ow) * s, np.arange(c), indexing="ij")
    for i in range(k):
        for j in range(k):
            v = xp[:, i:i + s * (oh - 1) + 1:s, j:j + s * (ow - 1) + 1:s, :]
            better = v > y
            y = np.where(better, v, y)
            idx = ((hh + i - p) * w + (ww + j - p)) * c + cc
            argmax = np.where(better, idx[None].astype(np.int32), argmax)
    return y, argmax


def maxpool_backward(argmax, dy, x_shape):
    n = x_shape[0]
    dx = np.zeros((n, int(np.prod(x_shape[1:]))), dy.dtype)
    for b in range(n):
        np.add.at(dx[b], argmax[b].ravel(), dy[b].ravel())
    return dx.reshape(x_shape)


def avgpool_forward(x, k, s, p):
    """Zero padding counted in the divisor (``count_include_pad=True``): divide by ``k*k``."""
    cols = im2col(x, k, k, s, p)
    return cols.sum(axis=(3, 4)) / (k * k)


def avgpool_backward(dy, x_shape, k, s, p):
    n, oh, ow, c = dy.shape
    dcols = np.broadcast_to((dy / (k * k))[:, :, :, None, None, :], (n, oh, ow, k, k, c))
    return col2im(np.ascontiguousarray(dcols), x_shape, s, p)


def gap_forward(x):
    return x.mean(axis=(1, 2))


def gap_backward(dy, x_shape):
    n, h, w, c = x_shape
    return np.broadcast_to(dy[:, None, None, :] / (h * w), x_shape).copy()


# ---------------------------------------------------------------------------- linear

def linear_forward(x2d, w, b):
    y = x2d @ w.T
    return y if b is None else y + b


def linear_backward(x2d, w, dy):
    """Returns ``(dx, dw, db)``."""
    return dy @ w, dy.T @ x2d, dy.sum(axis=0)


# ---------------------------------------------------------------------------- misc

def add_forward(a, b):
    return a + b


def add_backward(dy):
    """Returns ``(da, db)``."""
    return dy, dy


def flatten_forward(x):
    """NHWC -> ``(N, H*W*C)``, features in (H, W, C) order."""
    return x.reshape(x.shape[0], -1)


def flatten_backward(dy, x_shape):
    return dy.reshape(x_shape)


def channel_pad_forward(x, c_out):
    """Append zero channels up to ``c_out`` (NHWC or 2-D: the last axis)."""
    y = np.zeros(x.shape[:-1] + (c_out,), x.dtype)
    y[..., :x.shape[-1]] = x
    return y


def channel_pad_backward(dy, c_in):
    return dy[..., :c_in].copy()


# ---------------------------------------------------------------------------- dropout

_MASK64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_TWO_POW_MINUS_53 = 2.0 ** -53


def _mix64(z):
    """The splitmix64 finaliser (uint64 arithmetic, wrapping)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def dropout_uniform(seed, step, index):
    """Counter-based uniform in ``[0, 1)`` (float64) for flat element ``index`` of a draw.

    With wrapping uint64 arithmetic (``seed`` and ``step`` taken modulo 2**64):
        key = mix64(seed * GOLDEN + step)
        u   = (mix64(key + (index + 1) * GOLDEN) >> 11) * 2**-53
    where ``mix64`` is the splitmix64 finaliser and GOLDEN = 0x9E3779B97F4A7C15, i.e. ``u``
    is output ``index`` of a splitmix64 stream seeded with ``key``. Only 64-bit integer ops,
    a shift and one exact int->float64 conversion: a CUDA kernel reproduces it bit-exactly.
    """
    with np.errstate(over="ignore"):
        s = np.array([seed & _MASK64], np.uint64)
        t = np.array([step & _MASK64], np.uint64)
        key = _mix64(s * _GOLDEN + t)
        i = np.asarray(index).astype(np.uint64)
        z = _mix64(key + (i + np.uint64(1)) * _GOLDEN)
    return (z >> np.uint64(11)).astype(np.float64) * _TWO_POW_MINUS_53


def dropout_mask(shape, p, seed, step):
    """uint8 keep-mask: element ``i`` (flat, C order) is kept iff ``dropout_uniform(seed, step, i) >= p``.

    ``p`` is compared as a float64.
    """
    u = dropout_uniform(seed, step, np.arange(int(np.prod(shape)), dtype=np.uint64))
    return (u >= float(p)).astype(np.uint8).reshape(shape)


def _dropout_scale(p):
    return 1.0 / (1.0 - p) if p < 1.0 else 0.0


def dropout_forward(x, p, seed, step):
    """Inverted dropout: returns ``(y, mask)``, ``y = x * mask / (1 - p)`` (zeros when ``p == 1``)."""
    mask = dropout_mask(x.shape, p, seed, step)
    return x * mask * x.dtype.type(_dropout_scale(p)), mask


def dropout_backward(mask, dy, p):
    return dy * mask * dy.dtype.type(_dropout_scale(p))


# ---------------------------------------------------------------------------- channel_mul

def channel_mul_forward(x, s):
    """``y[n, h, w, c] = x[n, h, w, c] * s[n, c]`` (the squeeze-excitation scale)."""
    return x * s[:, None, None, :]


def channel_mul_backward(x, s, dy):
    """Returns ``(dx, ds)``: ``dx = dy * s``, ``ds[n, c] = sum_{h, w} dy * x``."""
    return dy * s[:, None, None, :], (dy * x).sum(axis=(1, 2))


# ---------------------------------------------------------------------------- drop_path

def drop_path_mask(n, p, seed, step):
    """uint8 keep flag per sample: sample ``i`` is kept iff ``dropout_uniform(seed, step, i) >= p``."""
    return dropout_mask((n,), p, seed, step)


def drop_path_forward(x, p, seed, step):
    """Stochastic depth (torchvision ``StochasticDepth(p, "row")``), training mode: returns ``(y, mask)``,
    ``y[n] = x[n] * mask[n] / (1 - p)``."""
    mask = drop_path_mask(x.shape[0], p, seed, step)
    return x * _per_sample(mask, x) * x.dtype.type(_dropout_scale(p)), mask


def drop_path_backward(mask, dy, p):
    return dy * _per_sample(mask, dy) * dy.dtype.type(_dropout_scale(p))


def _per_sample(mask, like):
    return mask.reshape((-1,) + (1,) * (like.ndim - 1)).astype(like.dtype)


# ---------------------------------------------------------------------------- loss

def softmax_cross_entropy(logits, labels, smoothing, grad_scale=1.0):
    """``torch.nn.CrossEntropyLoss(label_smoothing=smoothing)`` with mean reduction.

    Returns ``(mean_loss, dlogits)`` with ``dlogits = grad_scale * d(mean_loss)/d(logits)``.
    The smoothed target is ``(1 - smoothing) * onehot + smoothing / K``.
    """
    n, k = logits.shape
    z = logits - logits.max(axis=1, keepdims=True)
    logsum = np.log(np.exp(z).sum(axis=1, keepdims=True))
    logp = z - logsum
    target = np.full((n, k), smoothing / k, logits.dtype)
    target[np.arange(n), labels] += 1 - smoothing
    loss = -(target * logp).sum() / n
    dlogits = grad_scale * (np.exp(logp) - target) / n
    return float(loss), dlogits.astype(logits.dtype)


# ---------------------------------------------------------------------------- optimizers

def sgd_step(p, g, buf, lr, momentum, dampening, nesterov, weight_decay, first_step):
    """``torch.optim.SGD`` for one step. Returns ``(new_p, new_buf)`` (``buf`` unused without momentum)."""
    d = g + weight_decay * p
    if momentum != 0:
        buf = d.copy() if first_step else momentum * buf + (1 - dampening) * d
        d = d + momentum * buf if nesterov else buf
    return p - lr * d, buf


def adam_step(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step, decoupled):
    """``torch.optim.Adam`` (``decoupled=False``) or ``AdamW`` (``True``); ``step`` counts from 1.

    Returns ``(new_p, new_m, new_v)``.
    """
    if decoupled:
        p = p * (1 - lr * weight_decay)
    else:
        g = g + weight_decay * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    bias1 = 1 - beta1 ** step
    bias2 = 1 - beta2 ** step
    p = p - (lr / bias1) * m / (np.sqrt(v) / np.sqrt(bias2) + eps)
    return p, m, v
