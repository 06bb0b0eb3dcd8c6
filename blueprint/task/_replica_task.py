"""What a data-parallel replica changes in `DeepLearningTask` (kept here, so the task reads as before).

``dist`` is the task's `blueprint.distributed.Distributed` value, or None for one process; the
functions taking None return the single-process answer.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import replace as _replace

from blueprint._errors import ConfigError


def check_replica_batch(dist, batch: int, samples: int, drop_last: bool) -> None:
    """The global batch must split evenly over the replicas, and each must have a sample to train on."""
    if batch % dist.world_size:
        raise ConfigError(f"batch_size={batch} does not divide over world size {dist.world_size}: the batch size is "
                          f"the global batch, each rank trains on batch_size / world_size samples; use a multiple of "
                          f"{dist.world_size}, e.g. batch_size={max(1, batch // dist.world_size) * dist.world_size}")
    if samples < dist.world_size:
        raise ConfigError(f"{samples} training sample(s) cannot be shared by {dist.world_size} ranks; use more data or "
                          "fewer processes")


def replica_samples(dist, samples: int, batch: int, drop_last: bool) -> tuple[int, int]:
    """(samples per epoch, batch size) of this replica."""
    if dist is None:
        return samples, batch
    from blueprint.distributed import shard_samples
    return shard_samples(samples, dist.world_size, drop_last), batch // dist.world_size


def replica_loaders(dist, train, val):
    """The train loader over this rank's shard (per-rank batch), the val loader over its share of the set
    (either may be None)."""
    from blueprint.distributed import shard
    if train is not None:
        train = shard(train, dist.rank, dist.world_size, batch_size=train.batch_size // dist.world_size)
    if val is not None:
        val = shard(val, dist.rank, dist.world_size, evaluation=True)
    return train, val


def place_replica(dist) -> None:
    """On the CUDA path, each replica of a machine takes its own GPU (LOCAL_RANK) before its arena exists."""
    if dist is not None:
        from cuda_kernels.collective import select_local_device
        select_local_device()


def replicate(executor, dist):
    from blueprint.distributed import replicate as make_replica
    return make_replica(executor, dist)


def epoch_sums(dist, executor, position) -> tuple[int, int, float]:
    """The finished epoch's (samples, correct, loss sum) over every replica; then every replica takes
    rank 0's BN running statistics, the ones its checkpoint holds and every rank evaluates with."""
    from blueprint.distributed import sync_buffers
    from blueprint.distributed._replica import reduce_sums
    seen, correct, loss_sum = reduce_sums(dist, [position.seen, position.correct, position.loss_sum],
                                          "training metrics all-reduce")
    sync_buffers(executor, dist)
    return int(round(seen)), int(round(correct)), loss_sum


def reduce_metrics(dist, metrics: dict) -> dict:
    from blueprint.distributed._replica import reduce_metrics as reduce
    return reduce(dist, metrics)


@contextmanager
def stop_replicas_on_error(dist):
    """A rank whose training fails (a bad input, Ctrl-C, a peer's failure) leaves the process group, so
    every other rank stops at its next collective, even while this process lives on."""
    try:
        yield
    except BaseException:
        if dist is not None:
            dist.stop()
        raise


def check_world_size(path, recorded, dist) -> None:
    """Resuming with another world size: allowed (the global batch is the same), with a warning."""
    current = 1 if dist is None else dist.world_size
    if isinstance(recorded, bool) or not isinstance(recorded, int) or recorded < 1:
        raise ConfigError(f"{path}: the checkpoint's world_size must be an int >= 1, found {recorded!r}")
    if recorded != current:
        warnings.warn(f"{path} was trained on {recorded} process(es) and resumes on {current}: training continues "
                      "with the same global batch, but the shards, the per-replica BN statistics and the summation "
                      "order differ, so the run is not bit-identical to one that kept its world size",
                      RuntimeWarning, stacklevel=3)


def resumed_position(dist, position):
    """A mid-epoch position: the epoch's sums so far are rank 0's (it wrote them); the other replicas
    start theirs from zero, so the reduced sums at the epoch's end count each sample once."""
    return position if dist.is_writer else _replace(position, seen=0, correct=0, loss_sum=0.0)
