"""Each replica's share of the data: PyTorch `DistributedSampler` semantics over our loader.

Every rank draws the same permutation of an epoch (it is a pure function of the seed and the
epoch). Training: the permutation is padded by repeating its head until it divides evenly
(``drop_last=False``) or cut to the largest multiple of the world size (``drop_last=True``), and
rank ``r`` takes every ``world_size``-th index from ``r``, as `DistributedSampler` does; its batch
``b`` of ``B / world_size`` samples then holds exactly the samples of the single-process batch
``b`` of ``B`` (before the padding at the end). Evaluation: rank ``r`` takes indices
``r, r + W, ...`` without padding, so every sample counts once in the reduced metrics.

Augmentation draws depend on ``(seed, epoch, batch, rank)``: rank 0 keeps the single-process
streams, rank ``r > 0`` adds ``r`` to the stream's key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from blueprint.task.data import DataLoader
from blueprint.task.data._loader import AUGMENT_STREAM


def shard_samples(samples: int, world_size: int, drop_last: bool) -> int:
    """How many training samples each rank sees per epoch (`DistributedSampler.num_samples`)."""
    if drop_last and samples % world_size:
        return samples // world_size
    return math.ceil(samples / world_size)


@dataclass(frozen=True, eq=False)
class ShardedLoader(DataLoader):
    """A `DataLoader` over rank ``rank``'s shard; ``batch_size`` is the per-rank batch.

    >>> import numpy as np
    >>> from blueprint.task.data import ArrayDataset
    >>> ds = ArrayDataset(np.zeros((5, 1, 1, 1), np.uint8), np.arange(5))
    >>> [ShardedLoader(ds, 2, shuffle=False, rank=r, world_size=2).order(0).tolist() for r in (0, 1)]
    [[0, 2, 4], [1, 3, 0]]
    """

    rank: int = 0
    world_size: int = 1
    evaluation: bool = False     # every sample once, no padding (metrics)

    @property
    def shard_size(self) -> int:
        n = len(self.dataset)
        if self.evaluation:
            return len(range(self.rank, n, self.world_size))
        return shard_samples(n, self.world_size, self.drop_last)

    def __len__(self) -> int:
        k = self.shard_size
        return k // self.batch_size if self.drop_last else math.ceil(k / self.batch_size)

    @property
    def last_batch_size(self) -> int:
        remainder = self.shard_size % self.batch_size
        return self.batch_size if self.drop_last or remainder == 0 else remainder

    def order(self, epoch: int) -> np.ndarray:
        full = super().order(epoch)
        if self.evaluation:
            return np.ascontiguousarray(full[self.rank::self.world_size])
        total = self.shard_size * self.world_size
        if total > len(full):     # pad with the permutation's head, repeated as often as needed
            full = np.resize(full, total)
        return np.ascontiguousarray(full[self.rank:total:self.world_size])

    def augment_draws(self, epoch: int, index: int, size: int):
        if self.rank == 0 or self.augment is None:
            return super().augment_draws(epoch, index, size)
        pad = self.augment.crop_padding
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
            self.seed, spawn_key=(int(epoch), AUGMENT_STREAM, int(index), self.rank))))
        shifts = rng.integers(0, 2 * pad + 1, size=(2, size), dtype=np.int64) if pad \
            else np.full((2, size), pad, dtype=np.int64)
        flip = rng.random(size) < 0.5 if self.augment.hflip else np.zeros(size, dtype=np.bool_)
        return shifts[0], shifts[1], flip


def shard(loader: DataLoader, rank: int, world_size: int, evaluation: bool = False,
          batch_size: int | None = None) -> ShardedLoader:
    """``loader``'s settings over rank ``rank``'s shard (``batch_size``: the per-rank batch)."""
    return ShardedLoader(loader.dataset, batch_size or loader.batch_size, loader.shuffle, loader.seed,
                         loader.drop_last, loader.mean, loader.std, loader.augment, rank=rank,
                         world_size=world_size, evaluation=evaluation)
