"""A replica of a data-parallel run: what changes in one executor, and the reductions the task needs.

`replicate(executor, dist)` (once, before the first step):
- sets the executor's gradient reduction: after the last backward op, the flat ``grads`` region
  is all-reduced (sum) in place and scaled by ``1 / world_size``. Each rank's loss is the mean
  over its own batch and every rank has the same batch size (the sampler pads), so the result is
  the gradient of the mean loss over the global batch, as one process would compute it;
- with ``sync_batchnorm``, sets the BN kernels' sums hook: the per-channel sums (and the
  count) of the forward and of the backward's ``dx`` are all-reduced, so BN normalises over the
  global batch; ``dgamma``/``dbeta`` stay this replica's and are averaged with every gradient
  (exactly `torch.nn.SyncBatchNorm` under DDP). On the CUDA path the same sums are all-reduced by
  NCCL entries of the launch tape (``cuda_kernels.collective``), installed with the gradient's;
- gives rank ``r > 0`` its own dropout stream (``replica_seed``);
- broadcasts rank 0's parameters and BN statistics, as DDP does when it wraps a model.

Per-replica BN (the default) keeps each rank's running statistics; `sync_buffers` broadcasts
rank 0's before every evaluation and checkpoint, so every rank evaluates the model rank 0 saves.
"""
from __future__ import annotations

import numpy as np

from blueprint.distributed._group import Distributed


def replica_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s dropout stream: the task's own on rank 0."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence(seed, spawn_key=(rank,)).generate_state(1, np.uint32)[0] >> 1)


def replicate(executor, dist: Distributed):
    """Make ``executor`` one replica of the run ``dist`` describes (see the module's docstring)."""
    dist.start()
    executor.gradient_reduction = _gradient_reduction(executor, dist)
    if dist.sync_batchnorm and _on_host(executor):   # the CUDA path's: NCCL entries of its tape (above)
        executor.batchnorm_sums = _SyncedSums(dist)
    executor.seed = replica_seed(executor.seed, dist.rank)
    names = [p.name for p in executor.plan.params]
    state = executor.state_dict()
    executor.load_state_dict(dict(zip(names, _broadcast_arrays(dist, [state[n] for n in names], "parameter broadcast"))))
    return executor


def _on_host(executor) -> bool:
    return hasattr(executor, "arena") and isinstance(executor.arena, np.ndarray)


def _gradient_reduction(executor, dist: Distributed):
    if _on_host(executor):
        return _HostGradients(dist, executor)
    from cuda_kernels.collective import device_gradient_reduction
    return device_gradient_reduction(executor, dist)


class _HostGradients:
    """CPU path: gloo all-reduce on a zero-copy view of the arena's ``grads`` region, then the mean."""

    def __init__(self, dist: Distributed, executor):
        start, nbytes = executor.plan.memory.regions["grads"]
        self.dist = dist
        self.grads = executor.arena[start:start + nbytes].view(np.float32)
        self.inverse = np.float32(1.0 / dist.world_size)

    def __call__(self, executor, launcher=None) -> None:
        self.dist.all_reduce_sum(self.grads, f"gradient all-reduce of step {executor.step_count + 1}")
        np.multiply(self.grads, self.inverse, out=self.grads)


class _SyncedSums:
    """The BN kernels' sums hook under ``sync_batchnorm``: ``(count, s1, s2)`` summed over every replica."""

    def __init__(self, dist: Distributed):
        self.dist = dist

    def __call__(self, count, s1, s2):
        packed = np.concatenate(([float(count)], s1, s2)).astype(np.float64)
        self.dist.all_reduce_sum(packed, "synchronised BatchNorm all-reduce")
        c = len(s1)
        return int(round(packed[0])), packed[1:1 + c], packed[1 + c:]


def sync_buffers(executor, dist: Distributed) -> None:
    """Broadcast rank 0's BN running statistics (per-replica BN lets them differ)."""
    names = [p.name for p in executor.plan.params if p.region == "bn_stats"]
    if not names:
        return
    state = executor.state_dict()
    synced = _broadcast_arrays(dist, [state[n] for n in names], "BatchNorm statistics broadcast")
    executor.load_state_dict(dict(zip(names, synced)), strict=False)


def _broadcast_arrays(dist: Distributed, arrays: list, what: str) -> list:
    """Rank 0's values of ``arrays`` (one broadcast of their bytes)."""
    arrays = [np.asarray(a) for a in arrays]
    flat = np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays]) if arrays \
        else np.zeros(0, np.uint8)
    dist.broadcast(flat, what)
    out, offset = [], 0
    for a in arrays:
        out.append(flat[offset:offset + a.nbytes].view(a.dtype).reshape(a.shape))
        offset += a.nbytes
    return out


def reduce_sums(dist: Distributed, values, what: str) -> list[float]:
    """``values`` summed over every rank (float64)."""
    packed = np.array(values, dtype=np.float64)
    dist.all_reduce_sum(packed, what)
    return packed.tolist()


def reduce_metrics(dist: Distributed, metrics: dict) -> dict:
    """`classification_metrics` of this rank's evaluation shard -> those of the whole set."""
    n = metrics["samples"]
    keys = [k for k in ("loss", "top1", "top5") if k in metrics]
    sums = reduce_sums(dist, [n] + [metrics[k] * n for k in keys], "validation metrics all-reduce")
    total = int(round(sums[0]))
    out = {k: s / total for k, s in zip(keys, sums[1:])}
    for k in ("top1", "top5"):
        if k in out:
            out[k] = round(out[k] * total) / total    # counts of correct samples: integers
    out["samples"] = total
    return out
