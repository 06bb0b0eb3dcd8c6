"""ArrayDataset: images (NHWC) and integer labels held in memory, validated once."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IMAGE_DTYPES = (np.uint8, np.float32)
UINT8_SCALE = 255.0  # uint8 pixels are divided by this before mean/std normalisation
STATS_CHUNK = 4096   # samples per chunk in channel_stats(): never a float copy of the whole set
CHANNELS_FIRST_COUNTS = (1, 3, 4)   # (N, 3, 32, 32) is an NCHW batch of square images, not 3-row NHWC images
CHANNELS_FIRST_MIN_SIDE = 8


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """``x``: images ``(N, H, W, C)`` uint8 or float32; ``y``: labels ``(N,)``, integers >= 0.

    ``num_classes`` defaults to ``max(y) + 1``; ``classes`` optionally names them. A channels-first
    batch of square images such as ``(N, 3, 32, 32)`` is refused (it would train as 3-row images
    with 32 channels). Both arrays are kept as read-only views
    (labels converted to int64); the caller's arrays are not modified. Equality is identity.

    >>> import numpy as np
    >>> ds = ArrayDataset(np.zeros((6, 4, 4, 3), np.uint8), np.array([0, 1, 2, 0, 1, 2]), name="toy")
    >>> len(ds), ds.sample_shape, ds.num_classes
    (6, (4, 4, 3), 3)
    """

    x: np.ndarray
    y: np.ndarray
    name: str = ""
    num_classes: int | None = None
    classes: tuple[str, ...] | None = None   # class names by label (an image folder's subfolders)

    def __post_init__(self):
        where = f"ArrayDataset({self.name!r})"
        x, y = self.x, self.y
        if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
            raise TypeError(f"{where} expects numpy arrays for x and y; found {type(x).__name__}, {type(y).__name__}.")
        if x.ndim != 4:
            hint = (" For an MLP on (N, F) features reshape them to (N, 1, 1, F) yourself."
                    if x.ndim == 2 else " Add the missing axes, e.g. x[..., None] for (N, H, W) grey images.")
            raise ValueError(f"{where} expects x of shape (N, H, W, C) (NHWC); found shape {x.shape}.{hint}")
        if x.shape[1] in CHANNELS_FIRST_COUNTS and x.shape[2] == x.shape[3] >= CHANNELS_FIRST_MIN_SIDE:
            raise ValueError(f"{where} got x of shape {x.shape}, which is PyTorch's channels-first (N, C, H, W); "
                             f"blueprint takes NHWC (N, H, W, C): pass x.transpose(0, 2, 3, 1) "
                             f"(shape {(x.shape[0], x.shape[2], x.shape[3], x.shape[1])}).")
        if x.dtype not in IMAGE_DTYPES:
            raise TypeError(f"{where} expects x of dtype uint8 or float32; found {x.dtype}. "
                            "Convert with x.astype(np.float32) (or np.uint8 for 0..255 pixels).")
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
            raise TypeError(f"{where} expects y as a 1-D integer array of labels; found shape {y.shape}, "
                            f"dtype {y.dtype}. Pass class indices, e.g. y.astype(np.int64), not one-hot rows.")
        if len(y) != len(x):
            raise ValueError(f"{where} expects one label per image; found {len(x)} images and {len(y)} labels.")
        if len(y) and y.min() < 0:
            raise ValueError(f"{where} expects labels >= 0; found {int(y.min())} at index {int(np.argmin(y))}.")
        if len(y) == 0 and self.num_classes is None:
            raise ValueError(f"{where} is empty: x has shape {x.shape}, so the data contains no images; load the "
                             f"images first (or pass num_classes=... for a set that is empty on purpose)")
        if x.dtype == np.float32:
            _check_finite(x, where)
        largest = int(y.max()) if len(y) else -1
        num_classes = largest + 1 if self.num_classes is None else self.num_classes
        if num_classes <= largest or num_classes < 1:
            raise ValueError(f"{where} was given num_classes={self.num_classes} but found label {largest}; "
                             f"pass num_classes >= {largest + 1} or leave it None.")
        x = np.ascontiguousarray(x).view()
        y = np.ascontiguousarray(y, dtype=np.int64).view()
        x.flags.writeable = False
        y.flags.writeable = False
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "y", y)
        object.__setattr__(self, "num_classes", int(num_classes))
        if self.classes is not None:
            object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))
            if len(self.classes) != self.num_classes:
                raise ValueError(f"{where} has {self.num_classes} classes but {len(self.classes)} class names.")

    def __len__(self) -> int:
        return len(self.y)

    def __repr__(self) -> str:
        return (f"ArrayDataset(name={self.name!r}, n={len(self)}, sample_shape={self.sample_shape}, "
                f"dtype={self.x.dtype}, num_classes={self.num_classes})")

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return tuple(self.x.shape[1:])

    def channel_stats(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel mean and (population) std, in the units the DataLoader normalises.

        uint8 images are measured after dividing by 255, so the result can be passed as
        ``DataLoader(..., mean=mean, std=std)`` directly.

        >>> import numpy as np
        >>> x = np.array([0, 255], np.uint8).reshape(2, 1, 1, 1)
        >>> ArrayDataset(x, np.array([0, 1])).channel_stats()
        ((0.5,), (0.5,))
        """
        if len(self) == 0:
            raise ValueError(f"ArrayDataset({self.name!r}).channel_stats() needs at least one image; found none.")
        channels = self.x.shape[-1]
        # Sums are taken around the first image's mean so that E[d^2] - E[d]^2 does not cancel.
        shift = self.x[0].reshape(-1, channels).mean(axis=0, dtype=np.float64)
        total = np.zeros(channels)
        total_sq = np.zeros(channels)
        for start in range(0, len(self), STATS_CHUNK):
            chunk = self.x[start:start + STATS_CHUNK].reshape(-1, channels).astype(np.float64) - shift
            total += chunk.sum(axis=0)
            total_sq += np.square(chunk).sum(axis=0)
        count = len(self) * self.x.shape[1] * self.x.shape[2]
        scale = UINT8_SCALE if self.x.dtype == np.uint8 else 1.0
        mean_shifted = total / count
        var = np.maximum(total_sq / count - mean_shifted * mean_shifted, 0.0)
        mean = mean_shifted + shift
        return (tuple(float(m) for m in mean / scale), tuple(float(s) for s in np.sqrt(var) / scale))


def _check_finite(x: np.ndarray, where: str) -> None:
    """Refuse NaN/Inf pixels, naming the first one (chunked: never a boolean copy of the whole set)."""
    for start in range(0, len(x), STATS_CHUNK):
        chunk = x[start:start + STATS_CHUNK]
        bad = ~np.isfinite(chunk)
        if bad.any():
            n, h, w, c = np.argwhere(bad)[0]
            kind = "NaN" if np.isnan(chunk[n, h, w, c]) else "Inf"
            raise ValueError(f"{where}: the data contains {kind} (first at image {start + n}, pixel ({h}, {w}), "
                             f"channel {c}); drop or repair those images before training")


def validation_split(dataset: ArrayDataset, fraction: float = 0.2, seed: int = 0) -> tuple[ArrayDataset, ArrayDataset]:
    """``(train, val)`` from one labelled set, stratified: in every class, ``round(count * fraction)``
    samples chosen by a generator seeded with ``seed`` go to validation; both keep the set's order.
    The selected images are copied (a memory-mapped image folder becomes two in-memory sets).

    >>> import numpy as np
    >>> full = ArrayDataset(np.zeros((10, 2, 2, 1), np.uint8), np.array([0, 1] * 5), name="toy")
    >>> train, val = validation_split(full, 0.2)
    >>> len(train), len(val), val.name, sorted(val.y.tolist())
    (8, 2, 'toy-val', [0, 1])
    """
    if not isinstance(dataset, ArrayDataset):
        raise TypeError(f"validation_split expects an ArrayDataset; found {type(dataset).__name__}.")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ValueError(f"validation_split expects 0 < fraction < 1; found {fraction!r}.")
    rng = np.random.Generator(np.random.PCG64(seed))
    in_val = np.zeros(len(dataset), dtype=bool)
    for label in range(int(dataset.y.max()) + 1):
        members = np.flatnonzero(dataset.y == label)
        in_val[rng.choice(members, size=round(len(members) * fraction), replace=False)] = True
    if in_val.all() or not in_val.any():
        raise ValueError(f"validation_split of {dataset!r} with fraction {fraction} leaves "
                         f"{'no training' if in_val.all() else 'no validation'} samples; change the fraction.")
    return tuple(ArrayDataset(dataset.x[part], dataset.y[part], name=f"{dataset.name}-{suffix}",
                              num_classes=dataset.num_classes, classes=dataset.classes)
                 for part, suffix in ((~in_val, "train"), (in_val, "val")))
