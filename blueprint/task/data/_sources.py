"""Data sources: the bundled UCI digits, CIFAR-10 (binary version) from disk, synthetic images."""
from __future__ import annotations

import gzip
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

from blueprint.task.data._dataset import ArrayDataset, validation_split

DIGITS_FILE = "digits.csv.gz"          # sklearn's copy of the UCI test set; see DIGITS-LICENSE.txt
DIGITS_COUNT, DIGITS_SIDE, DIGITS_LEVELS = 1797, 8, 16
CIFAR_SIDE, CIFAR_CHANNELS, CIFAR_CLASSES = 32, 3, 10
CIFAR_RECORD = 1 + CIFAR_CHANNELS * CIFAR_SIDE * CIFAR_SIDE   # label byte + R, G, B planes
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
CIFAR_TEST_FILE = "test_batch.bin"
CIFAR_FOLDER = "cifar-10-batches-bin"  # what the official cifar-10-binary.tar.gz unpacks to
SYNTHETIC_CHUNK = 4096
SYNTHETIC_PROTOTYPES, SYNTHETIC_SAMPLES = 0, 1   # spawn_key slots: the distribution, then each draw from it


@lru_cache(maxsize=1)
def _digits_table() -> np.ndarray:
    with resources.files("blueprint.task.data").joinpath(DIGITS_FILE).open("rb") as raw:
        table = np.loadtxt(gzip.open(raw, "rt"), delimiter=",", dtype=np.int64)
    if table.shape != (DIGITS_COUNT, DIGITS_SIDE * DIGITS_SIDE + 1):
        raise ValueError(f"bundled {DIGITS_FILE} should hold {DIGITS_COUNT} rows of 65 integers; found shape "
                         f"{table.shape}. Reinstall blueprint-nn.")
    table.flags.writeable = False
    return table


def digits(val_fraction: float = 0.2, seed: int = 0) -> tuple[ArrayDataset, ArrayDataset]:
    """The UCI handwritten digits (1,797 images 8x8x1, 10 classes), split into (train, val).

    Pixels 0..16 are scaled to uint8 as ``p * 255 // 16`` (0 → 0, 8 → 127, 16 → 255). The
    split is stratified: in every class, ``round(count * val_fraction)`` images chosen by a
    generator seeded with ``seed`` go to validation. Both sets keep the file's order.

    >>> train, val = digits()
    >>> len(train), len(val), train.sample_shape, train.num_classes, train.x.dtype
    (1438, 359, (8, 8, 1), 10, dtype('uint8'))
    """
    if not isinstance(val_fraction, (int, float)) or not 0 < val_fraction < 1:
        raise ValueError(f"digits expects 0 < val_fraction < 1; found {val_fraction!r}.")
    table = _digits_table()
    pixels = (table[:, :-1] * 255 // DIGITS_LEVELS).astype(np.uint8)
    x = pixels.reshape(-1, DIGITS_SIDE, DIGITS_SIDE, 1)
    y = table[:, -1]
    return validation_split(ArrayDataset(x, y, name="digits"), val_fraction, seed)


def _read_cifar_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    size = path.stat().st_size
    if size == 0 or size % CIFAR_RECORD:
        raise ValueError(f"{path} should hold whole CIFAR-10 binary records of {CIFAR_RECORD} bytes "
                         f"(1 label + 3072 pixels); found {size} bytes. Re-download the binary version.")
    records = np.fromfile(path, dtype=np.uint8).reshape(-1, CIFAR_RECORD)
    labels = records[:, 0].astype(np.int64)
    if labels.max() >= CIFAR_CLASSES:
        raise ValueError(f"{path} has label {labels.max()}; CIFAR-10 labels are 0..9. Is this CIFAR-100?")
    planes = records[:, 1:].reshape(-1, CIFAR_CHANNELS, CIFAR_SIDE, CIFAR_SIDE)
    return np.ascontiguousarray(planes.transpose(0, 2, 3, 1)), labels


def cifar10(path) -> tuple[ArrayDataset, ArrayDataset]:
    """CIFAR-10 from the official *binary* version, as (train, test) uint8 NHWC datasets.

    ``path`` is the folder holding ``data_batch_1.bin`` … ``data_batch_5.bin`` and
    ``test_batch.bin`` (the ``cifar-10-batches-bin`` folder of ``cifar-10-binary.tar.gz``,
    or its parent). Each record is 1 label byte then 3072 bytes: the R, G and B 32x32 planes.

    >>> cifar10("/nonexistent")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileNotFoundError: CIFAR-10 file data_batch_1.bin not found in /nonexistent...
    """
    folder = Path(path)
    if not (folder / CIFAR_TRAIN_FILES[0]).exists() and (folder / CIFAR_FOLDER).is_dir():
        folder = folder / CIFAR_FOLDER
    for name in CIFAR_TRAIN_FILES + (CIFAR_TEST_FILE,):
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"CIFAR-10 file {name} not found in {folder}. Expected the binary version's layout: "
                f"{', '.join(CIFAR_TRAIN_FILES)} and {CIFAR_TEST_FILE} in one folder (unpack "
                f"cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html and pass "
                f"its {CIFAR_FOLDER} folder).")
    parts = [_read_cifar_file(folder / name) for name in CIFAR_TRAIN_FILES]
    train_x = np.concatenate([x for x, _ in parts])
    train_y = np.concatenate([y for _, y in parts])
    test_x, test_y = _read_cifar_file(folder / CIFAR_TEST_FILE)
    return (ArrayDataset(train_x, train_y, name="cifar10-train", num_classes=CIFAR_CLASSES),
            ArrayDataset(test_x, test_y, name="cifar10-test", num_classes=CIFAR_CLASSES))


def synthetic(n: int, sample_shape=(32, 32, 3), num_classes: int = 10, seed: int = 0, draw: int = 0) -> ArrayDataset:
    """A learnable uint8 image set: each class has its own colour and pixel pattern, plus noise.

    ``seed`` fixes the distribution: class ``k``'s prototype is a per-channel colour (uniform
    64..192) plus a fixed pattern (uniform ±32 per pixel). ``draw`` picks the sample from it:
    a sample is its prototype plus Gaussian noise (sigma 24), clipped to 0..255, and labels
    are balanced (``i % num_classes``, shuffled). So a train and a validation set of one task
    share ``seed`` and differ in ``draw``.

    >>> train, val = synthetic(100, (8, 8, 3), num_classes=4), synthetic(40, (8, 8, 3), num_classes=4, draw=1)
    >>> len(train), train.sample_shape, train.num_classes, train.x.dtype, len(val)
    (100, (8, 8, 3), 4, dtype('uint8'), 40)
    """
    sample_shape = tuple(sample_shape)
    if len(sample_shape) != 3 or any(not isinstance(s, int) or s < 1 for s in sample_shape):
        raise ValueError(f"synthetic expects sample_shape (H, W, C) of positive integers; found {sample_shape!r}.")
    if n < 1 or num_classes < 1:
        raise ValueError(f"synthetic expects n >= 1 and num_classes >= 1; found n={n}, num_classes={num_classes}.")
    for name, value in (("seed", seed), ("draw", draw)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"synthetic expects {name} as an integer >= 0; found {value!r}.")
    distribution = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(SYNTHETIC_PROTOTYPES,))))
    colour = distribution.uniform(64, 192, size=(num_classes, 1, 1, sample_shape[2]))
    prototypes = (colour + distribution.uniform(-32, 32, size=(num_classes,) + sample_shape)).astype(np.float32)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(SYNTHETIC_SAMPLES, draw))))
    y = rng.permutation(np.arange(n) % num_classes)
    x = np.empty((n,) + sample_shape, dtype=np.uint8)
    for start in range(0, n, SYNTHETIC_CHUNK):
        labels = y[start:start + SYNTHETIC_CHUNK]
        noise = rng.standard_normal((len(labels),) + sample_shape, dtype=np.float32) * 24
        x[start:start + len(labels)] = np.clip(np.rint(prototypes[labels] + noise), 0, 255)
    return ArrayDataset(x, y, name=f"synthetic-{n}-draw{draw}", num_classes=num_classes)
