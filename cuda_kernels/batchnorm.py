"""Batch normalisation on the 2-D view ``(M, C)`` of an fp16 activation; statistics fp32.

Training forward is two steps, so that a convolution can do the first one in its
epilogue (docs/internals/cuda-path.md, "Fusion in training"):
1. statistics: per-channel sum and sum of squares into the saved statistics' two slots (the plan's
   ``save_mean`` / ``save_invstd``, which hold the raw fp32 sums on this path; see the reductions below; a
   convolution epilogue accumulates them with atomics instead, zeroing them first);
2. apply: ``y = (x - mean) * invstd * gamma + beta`` (+ residual) (ReLU or ReLU6), elementwise. Each thread
   derives ``mean`` and ``invstd`` of its channels from the sums and the row count itself (``_mean_invstd``:
   the biased variance normalises), and the threads of the first row update the running statistics
   (``_update_running``: the unbiased variance is tracked, as PyTorch does). No finalize launch sits between.
Every other reader of the saved statistics (the backward's reduction and ``dx``, the recomputing apply of a
fused backward) derives them from the sums in the same way, so all agree bit for bit.
Backward: a reduction of ``dbeta = sum(dy)`` and ``dgamma = sum(dy * xhat)``, then ``dx``; where a ReLU / ReLU6
followed the apply (no residual), both take that activation's output gradient and gate it themselves (``GATE``).
Synchronised BN (data parallel, ``cuda_kernels.collective``): the sums of step 1 are summed over
the replicas before the apply, whose count is the global one (local rows x replicas; every reader takes
that count); in the backward, ``dbeta`` and
``dgamma`` are summed over the replicas before ``dx`` reads them (``dx`` divides by the global rows),
then scaled by ``1 / world_size``: the gradient all-reduce (an average) then leaves the mean of the
replicas' own sums, which is what ``torch.nn.SyncBatchNorm`` under DDP gives ``gamma`` and ``beta``.
The variance is ``E[x^2] - mean^2`` in fp32 (clamped at 0): fine for activations whose
mean is not large against their spread.

The reductions (statistics, and ``dgamma`` / ``dbeta`` in the backward) need no zero-fill launch: blocks add
their column totals with fp32 atomics into a ``ReductionScratch`` accumulator, and the last block of each column
of blocks to arrive (an arrival counter per column) stores the totals in the output and leaves the accumulator
and its counter at zero for the next launch. A scratch serves the launches of one stream, one after another.

Where ``channels % 8 == 0`` (and the arrays are 16-byte aligned) the ``_vec8`` kernels move 8 channels per
16-byte access (``cuda_kernels.vector``): in the apply and ``dx`` each thread owns one vector of channels for
the whole launch (its per-channel constants loaded once, no per-element division); in the reductions a block
owns up to ``THREADS`` vector columns and sums its rows in shared memory before one atomic per channel.
"""
import math

import numpy as np
from numba import cuda

from planner.ops import Prim

from .collective import SINGLE_REPLICA
from .elementwise import ACTIVATION_KERNELS
from .registry import F1, F32, H1, I1, I32, ONE, SIMULATOR, THREADS, ZERO, flat, grid_1d, kernel, nbt
from .vector import VEC8, channel_lanes, grid_vectors, load8, sm_count, store8, vectorisable

f16, f32, i32 = nbt.float16, nbt.float32, nbt.int32
# reduction block: 32 channels x 8 row lanes (the simulator, one Python thread each: 8 x 2)
COLS, ROWS = (8, 2) if SIMULATOR else (32, 8)
SUMS8 = 16   # a vector reduction's shared rows: 8 channels x two sums
REDUCTION_BLOCKS_PER_SM = 4   # the reductions' grids: about 4 blocks per SM (each block one atomic per channel)


def reduction_blocks():
    return 4 if SIMULATOR else REDUCTION_BLOCKS_PER_SM * sm_count()


class ReductionScratch:
    """The reductions' fp32 accumulator ``[2, channels]`` and int32 arrival counters (one per column of blocks),
    zero between launches: allocated zeroed (like the array ``like``: a device array, or numpy in the dry run of
    benchmarks/gpu, which has no device) and grown when a launch needs more; the launches recorded with a
    smaller one keep theirs. Launches sharing a scratch must run one after another (one stream)."""

    def __init__(self):
        self.acc = self.arrivals = None

    def views(self, like, channels, col_blocks):
        host = isinstance(like, np.ndarray)
        if self.acc is None or self.acc.size < 2 * channels or isinstance(self.acc, np.ndarray) != host:
            self.acc = _zeros(max(2 * channels, 4096), np.float32, host)
        if self.arrivals is None or self.arrivals.size < col_blocks or isinstance(self.arrivals, np.ndarray) != host:
            self.arrivals = _zeros(max(col_blocks, 256), np.int32, host)
        return self.acc[:2 * channels], self.arrivals[:col_blocks]


def _zeros(n, dtype, host):
    if host:
        return np.zeros(n, dtype)
    zeros = cuda.to_device(np.zeros(n, dtype))
    cuda.synchronize()   # the copy ran on the legacy stream: done before any stream's kernel reads it
    return zeros


DEFAULT_SCRATCH = ReductionScratch()   # the launchers' when the caller gives none (one stream at a time)


@cuda.jit(device=True)
def _publish_if_last(acc, arrivals, out1, out2, c, n, owner):
    """Called by every thread once its block's atomics into ``acc`` are issued: the last block of this column of
    blocks to arrive stores ``acc``'s totals for channels ``c .. c + n`` of each ``owner`` thread in ``out1`` /
    ``out2`` and sets them, and the column's counter, back to zero."""
    last = cuda.shared.array(1, nbt.int32)
    cuda.threadfence()   # this block's atomics are visible before its arrival is
    cuda.syncthreads()
    first_thread = cuda.threadIdx.x == 0 and cuda.threadIdx.y == 0
    if first_thread:
        last[0] = 1 if cuda.atomic.add(arrivals, cuda.blockIdx.x, 1) == cuda.gridDim.y - 1 else 0
    cuda.syncthreads()
    if last[0] == 1:
        channels = out1.size
        if owner:
            for k in range(n):   # read where the atomics landed (an atomic add of 0), then clear
                out1[c + k] = cuda.atomic.add(acc, c + k, ZERO)
                out2[c + k] = cuda.atomic.add(acc, channels + c + k, ZERO)
                acc[c + k] = ZERO
                acc[channels + c + k] = ZERO
        if first_thread:
            arrivals[cuda.blockIdx.x] = 0


@cuda.jit(device=True)
def _split_rows(size, channels, rows_per_block):
    """``(start, stop)``: the rows of this block's split of a reduction (``blockIdx.y``)."""
    start = i32(cuda.blockIdx.y) * rows_per_block
    return start, min(i32(size) // channels, start + rows_per_block)


@cuda.jit(device=True)
def _reduce_rows_and_add(a, b, acc, arrivals, out1, out2, c):
    """Sum the ROWS lanes of the block in shared memory, add the totals to ``acc`` and publish them if last."""
    s1 = cuda.shared.array((ROWS, COLS), nbt.float32)
    s2 = cuda.shared.array((ROWS, COLS), nbt.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    s1[ty, tx] = a
    s2[ty, tx] = b
    cuda.syncthreads()
    owner = ty == 0 and c < out1.size
    if owner:
        for r in range(1, ROWS):
            a += s1[r, tx]
            b += s2[r, tx]
        cuda.atomic.add(acc, c, a)
        cuda.atomic.add(acc, out1.size + c, b)
    _publish_if_last(acc, arrivals, out1, out2, c, 1, owner)


_STATS = (H1, F1, F1, F1, I1, I32, I32)


@kernel("batchnorm_stats", _STATS)
def _batchnorm_stats(x, sums, sumsq, acc, arrivals, channels, rows_per_block):
    c = cuda.blockIdx.x * COLS + cuda.threadIdx.x
    a, b = ZERO, ZERO
    if c < channels:
        start, stop = _split_rows(x.size, channels, rows_per_block)
        for r in range(start + cuda.threadIdx.y, stop, ROWS):
            v = f32(x[r * channels + c])
            a += v
            b += v * v
    _reduce_rows_and_add(a, b, acc, arrivals, sums, sumsq, c)


@cuda.jit(device=True)
def _vector_columns(channels):
    """This thread's place in a reduction block: ``(first channel, row lane, row lanes, columns, active)``; the
    block owns ``columns = min(vectors, blockDim)`` vector columns of ``blockIdx.x`` and ``blockDim // columns``
    row lanes."""
    vectors = channels // VEC8
    columns = min(vectors, i32(cuda.blockDim.x))
    lanes = i32(cuda.blockDim.x) // columns
    tx, lane = i32(cuda.threadIdx.x) % columns, i32(cuda.threadIdx.x) // columns
    v = i32(cuda.blockIdx.x) * columns + tx
    return v * VEC8, lane, lanes, columns, lane < lanes and v < vectors


@cuda.jit(device=True)
def _reduce_lanes_and_add8(a, b, acc, arrivals, out1, out2, c, lane, lanes, columns, active):
    """Sum the ``a[0:8]`` / ``b[0:8]`` of the block's row lanes of each vector column in shared memory
    (``shared[k, thread]``: consecutive threads, consecutive banks), add the totals to ``acc`` and publish them
    if last."""
    shared = cuda.shared.array((SUMS8, THREADS), nbt.float32)
    t = cuda.threadIdx.x
    for k in range(VEC8):
        shared[k, t] = a[k]
        shared[VEC8 + k, t] = b[k]
    cuda.syncthreads()
    owner = active and lane == 0
    if owner:
        for r in range(1, lanes):
            for k in range(VEC8):
                a[k] += shared[k, t + r * columns]
                b[k] += shared[VEC8 + k, t + r * columns]
        for k in range(VEC8):
            cuda.atomic.add(acc, c + k, a[k])
            cuda.atomic.add(acc, out1.size + c + k, b[k])
    _publish_if_last(acc, arrivals, out1, out2, c, VEC8, owner)


@kernel("batchnorm_stats_vec8", _STATS)
def _batchnorm_stats_vec8(x, sums, sumsq, acc, arrivals, channels, rows_per_block):
    a = cuda.local.array(VEC8, nbt.float32)
    b = cuda.local.array(VEC8, nbt.float32)
    v = cuda.local.array(VEC8, nbt.float32)
    c, lane, lanes, columns, active = _vector_columns(channels)
    for k in range(VEC8):
        a[k], b[k] = ZERO, ZERO
    if active:
        start, stop = _split_rows(x.size, channels, rows_per_block)
        for r in range(start + lane, stop, lanes):
            load8(v, x, r * channels + c)
            for k in range(VEC8):
                a[k] += v[k]
                b[k] += v[k] * v[k]
    _reduce_lanes_and_add8(a, b, acc, arrivals, sums, sumsq, c, lane, lanes, columns, active)


# What the apply's two statistics arrays hold: the running mean and variance (eval), or the batch sum and sum of
# squares over ``count`` rows (training and the recomputing apply); ``SUMS_UPDATE``: and update the running ones.
RUNNING, SUMS, SUMS_UPDATE = 0, 1, 2


@cuda.jit(device=True)
def _batch_mean_var(sums, sumsq, c, count):
    n = f32(count)
    mean = sums[c] / n
    return mean, max(sumsq[c] / n - mean * mean, ZERO)


@cuda.jit(device=True)
def _mean_invstd(a, b, c, stats, count, eps):
    """``(mean, invstd)`` of channel ``c`` from the apply's statistics arrays (``stats``: ``RUNNING`` or sums)."""
    if stats == RUNNING:
        mean, var = a[c], b[c]
    else:
        mean, var = _batch_mean_var(a, b, c, count)
    return mean, ONE / math.sqrt(var + eps)


@cuda.jit(device=True)
def _update_running(sums, sumsq, running_mean, running_var, c, count, momentum):
    """``running = (1 - momentum) * running + momentum * batch``, with the unbiased batch variance (PyTorch's)."""
    mean, var = _batch_mean_var(sums, sumsq, c, count)
    n = f32(count)
    unbiased = var * (n / max(n - ONE, ONE))
    running_mean[c] = (ONE - momentum) * running_mean[c] + momentum * mean
    running_var[c] = (ONE - momentum) * running_var[c] + momentum * unbiased


@cuda.jit(device=True)
def _normalise(x, i, c, a, b, gamma, beta, stats, count, eps):
    mean, invstd = _mean_invstd(a, b, c, stats, count, eps)
    return (f32(x[i]) - mean) * invstd * gamma[c] + beta[c]


# The activation fused into the apply: none, ReLU, or ReLU6 (MobileNetV2's blocks), through the same
# scalar bodies as their own kernels (the op table's pairs, planner/scalar_activations.py).
CLAMP = {None: 0, Prim.RELU: 1, Prim.RELU6: 2}
_relu, _relu6 = ACTIVATION_KERNELS[Prim.RELU].f, ACTIVATION_KERNELS[Prim.RELU6].f


@cuda.jit(device=True)
def _clamp(v, clamp):
    if clamp == 0:
        return v
    return _relu6(v, ZERO, ZERO) if clamp == 2 else _relu(v, ZERO, ZERO)


# (x, a, b, gamma, beta, y, channels, clamp, stats, eps, count, running_mean, running_var, momentum, update): ``a``,
# ``b`` as ``stats`` says; ``update`` (stats ``SUMS_UPDATE``): the running statistics are updated, once per channel.
_APPLY = (H1, F1, F1, F1, F1, H1, I32, I32, I32, F32, I32, F1, F1, F32, I32)


@kernel("batchnorm_apply", _APPLY)
def _batchnorm_apply(x, a, b, gamma, beta, y, channels, clamp, stats, eps, count, running_mean, running_var,
                     momentum, update):
    if update:
        for c in range(cuda.grid(1), channels, cuda.gridsize(1)):
            _update_running(a, b, running_mean, running_var, c, count, momentum)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        y[i] = f16(_clamp(_normalise(x, i, i % channels, a, b, gamma, beta, stats, count, eps), clamp))


@kernel("batchnorm_apply_residual", _APPLY[:5] + (H1,) + _APPLY[5:])
def _batchnorm_apply_residual(x, a, b, gamma, beta, residual, y, channels, clamp, stats, eps, count, running_mean,
                              running_var, momentum, update):
    if update:
        for c in range(cuda.grid(1), channels, cuda.gridsize(1)):
            _update_running(a, b, running_mean, running_var, c, count, momentum)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        v = _normalise(x, i, i % channels, a, b, gamma, beta, stats, count, eps) + f32(residual[i])
        y[i] = f16(_clamp(v, clamp))


@kernel("batchnorm_apply_vec8", _APPLY)
def _batchnorm_apply_vec8(x, a, b, gamma, beta, y, channels, clamp, stats, eps, count, running_mean, running_var,
                          momentum, update):
    if update:
        _update_running_vec8(a, b, running_mean, running_var, channels, count, momentum)
    _apply_vec8(x, a, b, gamma, beta, x, y, channels, clamp, stats, eps, count, False)


@kernel("batchnorm_apply_residual_vec8", _APPLY[:5] + (H1,) + _APPLY[5:])
def _batchnorm_apply_residual_vec8(x, a, b, gamma, beta, residual, y, channels, clamp, stats, eps, count,
                                   running_mean, running_var, momentum, update):
    if update:
        _update_running_vec8(a, b, running_mean, running_var, channels, count, momentum)
    _apply_vec8(x, a, b, gamma, beta, residual, y, channels, clamp, stats, eps, count, True)


@cuda.jit(device=True)
def _channel_lane(channels):
    """``(first channel, first row, row stride)`` of this thread in a per-channel grid (``channel_lanes``):
    the grid's threads cover ``lanes`` rows at a time, each thread the same vector of channels in each."""
    vectors = channels // VEC8
    t, lanes = i32(cuda.grid(1)), i32(cuda.gridsize(1)) // vectors
    return (t % vectors) * VEC8, t // vectors, lanes


@cuda.jit(device=True)
def _update_running_vec8(sums, sumsq, running_mean, running_var, channels, count, momentum):
    """The running statistics of this thread's channels, by the threads of the first row lane (one per channel)."""
    c, first, lanes = _channel_lane(channels)
    if first == 0 and lanes > 0:
        for k in range(VEC8):
            _update_running(sums, sumsq, running_mean, running_var, c + k, count, momentum)


@cuda.jit(device=True)
def _apply_vec8(x, a, b, gamma, beta, residual, y, channels, clamp, stats, eps, count, with_residual):
    m = cuda.local.array(VEC8, nbt.float32)
    scale = cuda.local.array(VEC8, nbt.float32)
    shift = cuda.local.array(VEC8, nbt.float32)
    v = cuda.local.array(VEC8, nbt.float32)
    res = cuda.local.array(VEC8, nbt.float32)
    c, first, lanes = _channel_lane(channels)
    if first >= lanes:
        return
    for k in range(VEC8):
        mean, invstd = _mean_invstd(a, b, c + k, stats, count, eps)
        m[k], scale[k], shift[k] = mean, invstd * gamma[c + k], beta[c + k]
    for r in range(first, i32(x.size) // channels, lanes):
        i = r * channels + c
        load8(v, x, i)
        if with_residual:
            load8(res, residual, i)
        for k in range(VEC8):
            u = (v[k] - m[k]) * scale[k] + shift[k]
            if with_residual:
                u += res[k]
            v[k] = _clamp(u, clamp)
        store8(y, i, v)


# The backward of an activation fused into the apply (no residual: ``GATE`` = ``CLAMP``'s codes): the reduce and dx
# take the activation's output gradient and gate it themselves, recomputing the apply's fp16 output from x, the
# saved statistics, gamma and beta as the apply does, so the activation output and the gated gradient are never
# read or written. ReLU passes where that output is > 0, ReLU6 where it is in (0, 6) (planner/scalar_activations.py).
GATE = {None: 0, Prim.RELU: 1, Prim.RELU6: 2}
SIX = nbt.float32(6.0)


@cuda.jit(device=True)
def _gated(g, pre, gate):
    """``g`` where the activation of code ``gate`` passes the gradient at the pre-activation ``pre``, else 0."""
    if gate == 0:
        return g
    y = f32(f16(pre))   # the apply's stored output: rounded to fp16 before the activation's own gate
    return g if y > ZERO and (gate == 1 or y < SIX) else ZERO


# (x, dy, sums, sumsq, gamma, beta, dgamma, dbeta, acc, arrivals, channels, rows_per_block, gate, count, eps):
# ``sums`` / ``sumsq`` the forward's batch sums over ``count`` rows (every replica's, with sync BN)
_BACKWARD_REDUCE = (H1, H1, F1, F1, F1, F1, F1, F1, F1, I1, I32, I32, I32, I32, F32)


@kernel("batchnorm_backward_reduce", _BACKWARD_REDUCE)
def _batchnorm_backward_reduce(x, dy, sums, sumsq, gamma, beta, dgamma, dbeta, acc, arrivals, channels,
                               rows_per_block, gate, count, eps):
    c = cuda.blockIdx.x * COLS + cuda.threadIdx.x
    a, b = ZERO, ZERO
    if c < channels:
        m, s = _mean_invstd(sums, sumsq, c, SUMS, count, eps)
        start, stop = _split_rows(x.size, channels, rows_per_block)
        for r in range(start + cuda.threadIdx.y, stop, ROWS):
            xhat = (f32(x[r * channels + c]) - m) * s
            g = _gated(f32(dy[r * channels + c]), xhat * gamma[c] + beta[c], gate)
            a += g
            b += g * xhat
    _reduce_rows_and_add(a, b, acc, arrivals, dbeta, dgamma, c)


@kernel("batchnorm_backward_reduce_vec8", _BACKWARD_REDUCE)
def _batchnorm_backward_reduce_vec8(x, dy, sums, sumsq, gamma, beta, dgamma, dbeta, acc, arrivals, channels,
                                    rows_per_block, gate, count, eps):
    a = cuda.local.array(VEC8, nbt.float32)
    b = cuda.local.array(VEC8, nbt.float32)
    m = cuda.local.array(VEC8, nbt.float32)
    s = cuda.local.array(VEC8, nbt.float32)
    scale = cuda.local.array(VEC8, nbt.float32)
    shift = cuda.local.array(VEC8, nbt.float32)
    g = cuda.local.array(VEC8, nbt.float32)
    v = cuda.local.array(VEC8, nbt.float32)
    c, lane, lanes, columns, active = _vector_columns(channels)
    for k in range(VEC8):
        a[k], b[k] = ZERO, ZERO
    if active:
        for k in range(VEC8):
            m[k], s[k] = _mean_invstd(sums, sumsq, c + k, SUMS, count, eps)
            scale[k], shift[k] = s[k] * gamma[c + k], beta[c + k]
        start, stop = _split_rows(x.size, channels, rows_per_block)
        for r in range(start + lane, stop, lanes):
            i = r * channels + c
            load8(g, dy, i)
            load8(v, x, i)
            for k in range(VEC8):
                gk = _gated(g[k], (v[k] - m[k]) * scale[k] + shift[k], gate)
                a[k] += gk
                b[k] += gk * (v[k] - m[k]) * s[k]
    _reduce_lanes_and_add8(a, b, acc, arrivals, dbeta, dgamma, c, lane, lanes, columns, active)


# (x, dy, sums, sumsq, gamma, beta, dgamma, dbeta, dx, channels, accumulate, replicas, gate, eps): the forward's
# sums and the backward's ``dgamma`` / ``dbeta`` both over ``rows x replicas`` rows
_BACKWARD_DX = (H1, H1, F1, F1, F1, F1, F1, F1, H1, I32, I32, I32, I32, F32)


@kernel("batchnorm_backward_dx", _BACKWARD_DX)
def _batchnorm_backward_dx(x, dy, sums, sumsq, gamma, beta, dgamma, dbeta, dx, channels, accumulate, replicas,
                           gate, eps):
    count = i32(x.size // channels) * replicas
    inv_rows = ONE / f32(count)   # sync BN: dgamma, dbeta are sums over the replicas
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        c = i % channels
        mean, invstd = _mean_invstd(sums, sumsq, c, SUMS, count, eps)
        xhat = (f32(x[i]) - mean) * invstd
        g = _gated(f32(dy[i]), xhat * gamma[c] + beta[c], gate)
        v = gamma[c] * invstd * (g - (dbeta[c] + xhat * dgamma[c]) * inv_rows)
        if accumulate:
            v += f32(dx[i])
        dx[i] = f16(v)


@kernel("batchnorm_backward_dx_vec8", _BACKWARD_DX)
def _batchnorm_backward_dx_vec8(x, dy, sums, sumsq, gamma, beta, dgamma, dbeta, dx, channels, accumulate,
                                replicas, gate, eps):
    m = cuda.local.array(VEC8, nbt.float32)
    s = cuda.local.array(VEC8, nbt.float32)
    gs = cuda.local.array(VEC8, nbt.float32)
    sh = cuda.local.array(VEC8, nbt.float32)
    kb = cuda.local.array(VEC8, nbt.float32)
    kg = cuda.local.array(VEC8, nbt.float32)
    xv = cuda.local.array(VEC8, nbt.float32)
    gv = cuda.local.array(VEC8, nbt.float32)
    out = cuda.local.array(VEC8, nbt.float32)
    rows = i32(x.size) // channels
    inv_rows = ONE / f32(rows * replicas)   # sync BN: dgamma, dbeta are sums over the replicas
    c, first, lanes = _channel_lane(channels)
    if first >= lanes:
        return
    for k in range(VEC8):
        m[k], s[k] = _mean_invstd(sums, sumsq, c + k, SUMS, rows * replicas, eps)
        gs[k], kb[k], kg[k] = gamma[c + k] * s[k], dbeta[c + k] * inv_rows, dgamma[c + k] * inv_rows
        sh[k] = beta[c + k]
    for r in range(first, rows, lanes):
        i = r * channels + c
        load8(xv, x, i)
        load8(gv, dy, i)
        if accumulate:
            load8(out, dx, i)
        else:
            for k in range(VEC8):
                out[k] = ZERO
        for k in range(VEC8):
            g = _gated(gv[k], (xv[k] - m[k]) * gs[k] + sh[k], gate)
            out[k] += gs[k] * (g - (kb[k] + (xv[k] - m[k]) * s[k] * kg[k]))
        store8(dx, i, out)


@kernel("batchnorm_replica_share", (F1, F1, F32))
def _batchnorm_replica_share(dgamma, dbeta, inverse_world_size):
    for c in range(cuda.grid(1), dgamma.size, cuda.gridsize(1)):
        dgamma[c] *= inverse_world_size
        dbeta[c] *= inverse_world_size


def _reduction_grid(rows, channels, vector):
    """``(grid, block, rows_per_block)`` of a reduction: column blocks x row splits, about
    ``reduction_blocks()`` blocks in all, each split at least 4 rows per row lane."""
    if vector:
        columns = min(channels // VEC8, THREADS)
        col_blocks, lanes, block = math.ceil(channels // VEC8 / columns), THREADS // columns, THREADS
    else:
        col_blocks, lanes, block = math.ceil(channels / COLS), ROWS, (COLS, ROWS)
    splits = max(1, min(math.ceil(reduction_blocks() / col_blocks), math.ceil(rows / (4 * lanes))))
    rows_per_block = math.ceil(rows / splits)
    return (col_blocks, math.ceil(rows / rows_per_block)), block, np.int32(rows_per_block)


def _launch_per_channel(launcher, scalar, vec8, x2d, arrays, *args):
    """The ``_vec8`` kernel on its per-channel grid where ``channels % 8 == 0`` and ``arrays`` are 16-byte
    aligned, else the one-element kernel on a flat grid."""
    channels = tuple(x2d.shape)[-1]
    if vectorisable(channels, VEC8, *arrays):
        launcher.launch(vec8, *channel_lanes(x2d.size // channels, channels // VEC8), *args)
    else:
        launcher.launch(scalar, *grid_vectors(x2d.size), *args)


def batchnorm_stats(launcher, x2d, sums, sumsq, scratch=None):
    """``sums[c] = sum_m x[m, c]``, ``sumsq[c] = sum_m x[m, c]**2`` (overwritten; one launch)."""
    channels = tuple(x2d.shape)[-1]
    vector = vectorisable(channels, VEC8, x2d)
    grid, block, rows_per_block = _reduction_grid(x2d.size // channels, channels, vector)
    acc, arrivals = (scratch or DEFAULT_SCRATCH).views(sums, channels, grid[0])
    launcher.launch(_batchnorm_stats_vec8 if vector else _batchnorm_stats, grid, block, flat(x2d), sums, sumsq,
                    acc, arrivals, np.int32(channels), rows_per_block)


def _apply(launcher, x2d, a, b, gamma, beta, y2d, activation, residual, stats, eps, count=0, running=None,
           momentum=0.0):
    """The apply of ``stats`` (``RUNNING``: ``a``, ``b`` the running mean and variance; else the batch sums over
    ``count`` rows); ``running``: the ``(mean, var)`` that ``SUMS_UPDATE`` updates."""
    if activation not in CLAMP:
        raise ValueError(f"batchnorm: the fused activation must be one of {sorted(CLAMP, key=str)}, got {activation!r}")
    running_mean, running_var = running if running is not None else (a, b)   # not touched unless updated
    head = (flat(x2d), a, b, gamma, beta)
    tail = (flat(y2d), np.int32(tuple(x2d.shape)[-1]), np.int32(CLAMP[activation]), np.int32(stats),
            np.float32(eps), np.int32(count), running_mean, running_var, np.float32(momentum),
            np.int32(stats == SUMS_UPDATE))
    if residual is None:
        _launch_per_channel(launcher, _batchnorm_apply, _batchnorm_apply_vec8, x2d, (x2d, y2d), *head, *tail)
    else:
        _launch_per_channel(launcher, _batchnorm_apply_residual, _batchnorm_apply_residual_vec8, x2d,
                            (x2d, y2d, residual), *head, flat(residual), *tail)


def batchnorm_forward_train(launcher, x2d, gamma, beta, y2d, save_sum, save_sumsq, running_mean, running_var,
                            momentum, eps, activation=None, residual=None, sums_ready=False,
                            collectives=SINGLE_REPLICA, scratch=None):
    """Training BN (+ residual add) (+ ``activation``: None, "relu" or "relu6"). ``save_sum`` / ``save_sumsq``: the
    batch sum and sum of squares, what the backward reads (the plan's saved statistics' slots). ``sums_ready``: a
    convolution epilogue already accumulated them from ``x2d``. ``collectives``: the step's
    (``cuda_kernels.collective``); with ``sync_batchnorm`` the statistics are those of every replica's batch.
    ``scratch``: the reductions' ``ReductionScratch`` (``DEFAULT_SCRATCH`` if None). The running statistics are
    updated by the apply (no launch of their own)."""
    channels = tuple(x2d.shape)[-1]
    if not sums_ready:
        batchnorm_stats(launcher, x2d, save_sum, save_sumsq, scratch)
    replicas = collectives.batchnorm_sums(launcher, "bn_statistics", save_sum, save_sumsq)
    _apply(launcher, x2d, save_sum, save_sumsq, gamma, beta, y2d, activation, residual, SUMS_UPDATE, eps,
           x2d.size // channels * replicas, (running_mean, running_var), momentum)


def batchnorm_forward_eval(launcher, x2d, gamma, beta, running_mean, running_var, eps, y2d, activation=None,
                           residual=None):
    _apply(launcher, x2d, running_mean, running_var, gamma, beta, y2d, activation, residual, RUNNING, eps)


def batchnorm_apply_saved(launcher, x2d, gamma, beta, save_sum, save_sumsq, eps, y2d, activation=None,
                          residual=None, collectives=SINGLE_REPLICA):
    """Training BN's output again from the saved batch sums (the recomputation of a fused backward)."""
    count = x2d.size // tuple(x2d.shape)[-1] * collectives.batchnorm_replicas()
    _apply(launcher, x2d, save_sum, save_sumsq, gamma, beta, y2d, activation, residual, SUMS, eps, count)


def batchnorm_backward(launcher, x2d, gamma, save_sum, save_sumsq, dy2d, dx2d, dgamma, dbeta, accumulate, *, eps,
                       collectives=SINGLE_REPLICA, scratch=None, beta=None, activation=None):
    """``dgamma``, ``dbeta`` are overwritten; ``dx2d`` (or None) overwritten or accumulated. ``save_sum`` /
    ``save_sumsq``: the forward's batch sums (``batchnorm_forward_train``), from which both kernels derive the
    mean and invstd (with ``eps``). With ``sync_batchnorm`` they and ``dx`` use the sums of every replica (see the
    module header); without ``dx`` there is nothing to synchronise.
    ``activation`` (a key of ``GATE``; needs ``beta``): ``dy2d`` is the gradient of that activation's output, applied
    to this BN's output without a residual, and is gated here (the activation's backward is not launched)."""
    if activation not in GATE or (activation is not None and beta is None):
        raise ValueError(f"batchnorm_backward: the gated activation must be one of {sorted(GATE, key=str)} "
                         f"(with beta), got {activation!r} (beta {'missing' if beta is None else 'given'})")
    channels = tuple(x2d.shape)[-1]
    beta, gate = gamma if beta is None else beta, np.int32(GATE[activation])   # ungated: beta is never used
    vector = vectorisable(channels, VEC8, x2d, dy2d)
    grid, block, rows_per_block = _reduction_grid(x2d.size // channels, channels, vector)
    acc, arrivals = (scratch or DEFAULT_SCRATCH).views(dgamma, channels, grid[0])
    count = x2d.size // channels * collectives.batchnorm_replicas()
    launcher.launch(_batchnorm_backward_reduce_vec8 if vector else _batchnorm_backward_reduce, grid, block,
                    flat(x2d), flat(dy2d), save_sum, save_sumsq, gamma, beta, dgamma, dbeta, acc, arrivals,
                    np.int32(channels), rows_per_block, gate, np.int32(count), np.float32(eps))
    if dx2d is None:
        return
    replicas = collectives.batchnorm_sums(launcher, "bn_gradient_sums", dgamma, dbeta)
    _launch_per_channel(launcher, _batchnorm_backward_dx, _batchnorm_backward_dx_vec8, x2d, (x2d, dy2d, dx2d),
                        flat(x2d), flat(dy2d), save_sum, save_sumsq, gamma, beta, dgamma, dbeta, flat(dx2d),
                        np.int32(channels), np.int32(accumulate), np.int32(replicas), gate, np.float32(eps))
    if replicas > 1:
        launcher.launch(_batchnorm_replica_share, *grid_1d(channels), dgamma, dbeta, np.float32(1.0 / replicas))
