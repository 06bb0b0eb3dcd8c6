"""DataLoader: deterministic shuffled batches, normalised and augmented by one numba kernel.

Randomness is a pure function of position. The sample order of epoch ``e`` comes from a
PCG64 generator seeded by ``SeedSequence(seed, spawn_key=(e, ORDER_STREAM, 0))``; the
augmentation draws of batch ``b`` from ``SeedSequence(seed, spawn_key=(e, AUGMENT_STREAM, b))``.
So a run resumed at epoch ``e`` (or at batch ``b`` of it, via ``batch(e, b)``) sees exactly
the batches an uninterrupted run would have seen, and nothing depends on iteration history.

Per batch the kernel gathers the selected images and writes, for every output pixel,
``(pixel / divisor - mean[c]) / std[c]`` in float64 rounded to float32, where ``divisor`` is
255 for uint8 images and 1 for float32. Random crop pads with raw zeros (black, as
torchvision's ``RandomCrop(padding=p)`` before ``Normalize``), so padded pixels become
``-mean[c] / std[c]``; the horizontal flip is applied to the crop. The dataset itself is
never copied or normalised as a whole.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from blueprint.task.data._dataset import UINT8_SCALE, ArrayDataset

ORDER_STREAM = 0    # spawn_key slot for the per-epoch permutation
AUGMENT_STREAM = 1  # spawn_key slot for the per-batch augmentation draws


@dataclass(frozen=True)
class Augment:
    """Training-time augmentation: random crop with ``crop_padding`` zero pixels per side
    (output keeps the input size) and a horizontal flip with probability 1/2.

    >>> Augment(crop_padding=4, hflip=True)
    Augment(crop_padding=4, hflip=True)
    """

    crop_padding: int = 0
    hflip: bool = False

    def __post_init__(self):
        if isinstance(self.crop_padding, bool) or not isinstance(self.crop_padding, int) or self.crop_padding < 0:
            raise ValueError(f"Augment expects crop_padding as an integer >= 0; found {self.crop_padding!r}.")
        if not isinstance(self.hflip, bool):
            raise TypeError(f"Augment expects hflip True or False; found {self.hflip!r}.")


def _generator(seed: int, epoch: int, stream: int, index: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(epoch, stream, index))))


def _per_channel(what: str, value, channels: int, default: float) -> np.ndarray:
    if value is None:
        return np.full(channels, default)
    values = np.atleast_1d(np.asarray(value, dtype=np.float64))
    if values.ndim != 1 or len(values) not in (1, channels):
        raise ValueError(f"DataLoader expects {what} as one number or {channels} per-channel numbers; "
                         f"found {value!r}. Use dataset.channel_stats() to compute them.")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"DataLoader expects finite {what} values; found {value!r}.")
    return np.broadcast_to(values, (channels,)).copy()


@functools.cache
def _fill_batch_kernel():
    """`_fill_batch`, compiled by numba. numba is imported at the first batch, not with this module, so
    the DSL, the planner, the CLI's parsing and checkpoint I/O import without numba installed."""
    from cpu_ref._cache_dir import use_user_cache_dir
    use_user_cache_dir()
    from numba import njit
    return njit(cache=True)(_fill_batch)


def _fill_batch(x, indices, divisor, mean, std, pad, shift_y, shift_x, flip, out):
    height, width, channels = x.shape[1], x.shape[2], x.shape[3]
    for b in range(indices.shape[0]):
        image = x[indices[b]]
        for h in range(height):
            src_h = h + shift_y[b] - pad
            for w in range(width):
                src_w = (width - 1 - w if flip[b] else w) + shift_x[b] - pad
                inside = 0 <= src_h < height and 0 <= src_w < width
                for c in range(channels):
                    raw = np.float64(image[src_h, src_w, c]) if inside else 0.0
                    out[b, h, w, c] = np.float32((raw / divisor - mean[c]) / std[c])


@dataclass(frozen=True, eq=False)
class DataLoader:
    """Batches of ``(x float32 NHWC C-contiguous, y int64)`` over an :class:`ArrayDataset`.

    ``mean``/``std``: one number or one per channel, in units after uint8 → /255
    (``dataset.channel_stats()`` gives them); None means 0 / 1. ``augment``: an
    :class:`Augment` or None. The last partial batch is yielded unless ``drop_last``.

    >>> import numpy as np
    >>> ds = ArrayDataset(np.arange(5, dtype=np.uint8).reshape(5, 1, 1, 1), np.arange(5))
    >>> loader = DataLoader(ds, batch_size=2, seed=3)
    >>> len(loader), loader.last_batch_size
    (3, 1)
    >>> [y.tolist() for _, y in loader.epoch(0)] == [y.tolist() for _, y in loader.epoch(0)]
    True
    >>> sorted(int(v) for _, y in loader.epoch(1) for v in y)
    [0, 1, 2, 3, 4]
    """

    dataset: ArrayDataset
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    mean: tuple[float, ...] | float | None = None
    std: tuple[float, ...] | float | None = None
    augment: Augment | None = None
    _mean: np.ndarray = field(init=False, repr=False)
    _std: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.dataset, ArrayDataset):
            raise TypeError(f"DataLoader expects an ArrayDataset; found {type(self.dataset).__name__}. "
                            "Wrap arrays with ArrayDataset(x, y).")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"DataLoader expects batch_size as an integer >= 1; found {self.batch_size!r}.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"DataLoader expects seed as an integer >= 0; found {self.seed!r}.")
        if self.augment is not None and not isinstance(self.augment, Augment):
            raise TypeError(f"DataLoader expects augment=Augment(...) or None; found {self.augment!r}.")
        channels = self.dataset.sample_shape[-1]
        mean = _per_channel("mean", self.mean, channels, 0.0)
        std = _per_channel("std", self.std, channels, 1.0)
        if np.any(std <= 0):
            channel = int(np.argmax(std <= 0))
            raise ValueError(f"DataLoader expects std > 0 in every channel; found std {std[channel]:g} in channel "
                             f"{channel} of {self.dataset!r} (a constant channel, if it came from channel_stats()); "
                             f"pass std=1 for that channel, or drop the channel from the data.")
        if len(self) == 0:
            raise ValueError(f"DataLoader over {self.dataset!r} with batch_size={self.batch_size}, "
                             f"drop_last={self.drop_last} yields no batches. Lower batch_size or set drop_last=False.")
        object.__setattr__(self, "_mean", mean)
        object.__setattr__(self, "_std", std)

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    @property
    def steps_per_epoch(self) -> int:
        return len(self)

    @property
    def last_batch_size(self) -> int:
        """Size of the final batch of an epoch (``batch_size`` unless a partial batch is kept)."""
        remainder = len(self.dataset) % self.batch_size
        return self.batch_size if self.drop_last or remainder == 0 else remainder

    def order(self, epoch: int) -> np.ndarray:
        """Sample indices of ``epoch`` in visiting order (int64): a pure function of (seed, epoch)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"DataLoader expects epoch as an integer >= 0; found {epoch!r}.")
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        return _generator(self.seed, int(epoch), ORDER_STREAM, 0).permutation(n).astype(np.int64)

    def augment_draws(self, epoch: int, index: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(shift_y, shift_x, flip)`` for batch ``index`` of ``epoch``: crop offsets into the
        padded image (0..2*crop_padding; ``crop_padding`` means centred) and flip flags."""
        pad = self.augment.crop_padding if self.augment else 0
        shifts = np.full((2, size), pad, dtype=np.int64)
        flip = np.zeros(size, dtype=np.bool_)
        if self.augment is not None:
            rng = _generator(self.seed, int(epoch), AUGMENT_STREAM, int(index))
            if pad:
                shifts = rng.integers(0, 2 * pad + 1, size=(2, size), dtype=np.int64)
            if self.augment.hflip:
                flip = rng.random(size) < 0.5
        return shifts[0], shifts[1], flip

    def batch(self, epoch: int, index: int, order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Batch ``index`` of ``epoch`` as ``(x, y)``; ``order`` may pass ``self.order(epoch)``
        to avoid recomputing the permutation."""
        if not 0 <= index < len(self):
            raise IndexError(f"DataLoader has {len(self)} batches per epoch; found batch index {index}.")
        order = self.order(epoch) if order is None else order
        indices = np.ascontiguousarray(order[index * self.batch_size:(index + 1) * self.batch_size])
        x = self.dataset.x
        out = np.empty((len(indices),) + self.dataset.sample_shape, dtype=np.float32)
        shift_y, shift_x, flip = self.augment_draws(epoch, index, len(indices))
        pad = self.augment.crop_padding if self.augment else 0
        divisor = UINT8_SCALE if x.dtype == np.uint8 else 1.0
        _fill_batch_kernel()(x, indices, divisor, self._mean, self._std, pad, shift_y, shift_x, flip, out)
        return out, self.dataset.y[indices]

    def epoch(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield every batch of ``epoch`` in order; each batch is a fresh array."""
        order = self.order(epoch)
        for index in range(len(self)):
            yield self.batch(epoch, index, order)
