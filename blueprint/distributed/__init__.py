"""Data-parallel training on `torch.distributed`: process group, sharding, gradient all-reduce.

`DeepLearningTask().distributed()` reads the rank and world size torchrun set; the launch
commands are in the README's "Training on several processes, GPUs or machines".
"""
from blueprint.distributed._group import DEFAULT_TIMEOUT_S, Distributed, DistributedError
from blueprint.distributed._replica import replica_seed, replicate, sync_buffers
from blueprint.distributed._shard import ShardedLoader, shard, shard_samples

__all__ = ["DEFAULT_TIMEOUT_S", "Distributed", "DistributedError", "ShardedLoader", "replica_seed", "replicate",
           "shard", "shard_samples", "sync_buffers"]
