"""Datasets, sources and the DataLoader (numba batch kernel) against plain-numpy references."""
import gzip

import numpy as np
import pytest

from blueprint.task.data import ArrayDataset, Augment, DataLoader, cifar10, digits, synthetic
from blueprint.task.data._sources import CIFAR_TEST_FILE, CIFAR_TRAIN_FILES


def indexed_dataset(n=23, shape=(5, 6, 3), dtype=np.uint8):
    """Image i is filled with a pattern whose first pixel encodes i, so batches can be traced back."""
    rng = np.random.default_rng(1)
    x = rng.integers(1, 255, size=(n,) + shape).astype(dtype)
    x[:, 0, 0, 0] = np.arange(n)
    return ArrayDataset(x, np.arange(n) % 4, name="indexed")


def reference_batch(loader, epoch, index):
    """Plain numpy: gather, zero-pad, crop, flip, then (x / divisor - mean) / std."""
    ds = loader.dataset
    order = loader.order(epoch)
    indices = order[index * loader.batch_size:(index + 1) * loader.batch_size]
    images = ds.x[indices].astype(np.float64)
    pad = loader.augment.crop_padding if loader.augment else 0
    shift_y, shift_x, flip = loader.augment_draws(epoch, index, len(indices))
    h, w = ds.sample_shape[:2]
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    out = np.empty_like(images)
    for b in range(len(indices)):
        crop = padded[b, shift_y[b]:shift_y[b] + h, shift_x[b]:shift_x[b] + w]
        out[b] = crop[:, ::-1] if flip[b] else crop
    divisor = 255.0 if ds.x.dtype == np.uint8 else 1.0
    mean = np.broadcast_to(np.asarray(loader._mean), (ds.sample_shape[-1],))
    std = np.broadcast_to(np.asarray(loader._std), (ds.sample_shape[-1],))
    return ((out / divisor - mean) / std).astype(np.float32), ds.y[indices]


# ---------------------------------------------------------------- ArrayDataset

def test_dataset_properties_and_read_only_views():
    x = np.zeros((4, 2, 3, 1), np.float32)
    y = np.array([0, 2, 1, 2], np.int32)
    ds = ArrayDataset(x, y, name="tiny")
    assert (len(ds), ds.sample_shape, ds.num_classes, ds.y.dtype) == (4, (2, 3, 1), 3, np.int64)
    assert ArrayDataset(x, y, num_classes=10).num_classes == 10
    with pytest.raises(ValueError):
        ds.x[0, 0, 0, 0] = 1.0
    x[0, 0, 0, 0] = 1.0  # the caller's array stays writeable
    assert x.flags.writeable


BAD_DATASETS = [
    (lambda: ArrayDataset(np.zeros((4, 16), np.float32), np.zeros(4, int)), ValueError, "reshape them to (N, 1, 1, F)"),
    (lambda: ArrayDataset(np.zeros((4, 8, 8), np.uint8), np.zeros(4, int)), ValueError, "x[..., None]"),
    (lambda: ArrayDataset(np.zeros((4, 2, 2, 1), np.float64), np.zeros(4, int)), TypeError, "found float64"),
    (lambda: ArrayDataset(np.zeros((4, 2, 2, 1), np.uint8), np.zeros(3, int)), ValueError,
     "found 4 images and 3 labels"),
    (lambda: ArrayDataset(np.zeros((3, 2, 2, 1), np.uint8), np.array([0, -1, 1])), ValueError,
     "labels >= 0; found -1 at index 1"),
    (lambda: ArrayDataset(np.zeros((3, 2, 2, 1), np.uint8), np.zeros(3, np.float32)), TypeError,
     "1-D integer array"),
    (lambda: ArrayDataset(np.zeros((3, 2, 2, 1), np.uint8), np.zeros((3, 10), int)), TypeError, "not one-hot"),
    (lambda: ArrayDataset(np.zeros((3, 2, 2, 1), np.uint8), np.array([0, 5, 1]), num_classes=5), ValueError,
     "num_classes >= 6"),
    (lambda: ArrayDataset([[1]], np.zeros(1, int)), TypeError, "numpy arrays"),
]


@pytest.mark.parametrize("make, error, fragment", BAD_DATASETS, ids=[b[2] for b in BAD_DATASETS])
def test_bad_datasets_raise_clear_errors(make, error, fragment):
    with pytest.raises(error) as info:
        make()
    assert fragment in str(info.value)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_channel_stats_match_numpy(dtype, monkeypatch):
    monkeypatch.setattr("blueprint.task.data._dataset.STATS_CHUNK", 3)  # exercise chunking
    ds = indexed_dataset(n=10, dtype=dtype)
    mean, std = ds.channel_stats()
    scale = 255.0 if dtype == np.uint8 else 1.0
    values = ds.x.astype(np.float64) / scale
    np.testing.assert_allclose(mean, values.mean(axis=(0, 1, 2)), rtol=1e-12)
    np.testing.assert_allclose(std, values.std(axis=(0, 1, 2)), rtol=1e-10)


# ---------------------------------------------------------------- DataLoader: order and batching

def test_order_is_a_pure_function_of_seed_and_epoch():
    ds = indexed_dataset()
    a, b = DataLoader(ds, 4, seed=7), DataLoader(ds, 4, seed=7)
    np.testing.assert_array_equal(a.order(3), b.order(3))
    assert not np.array_equal(a.order(0), a.order(1))
    assert not np.array_equal(a.order(0), DataLoader(ds, 4, seed=8).order(0))
    np.testing.assert_array_equal(DataLoader(ds, 4, shuffle=False).order(5), np.arange(len(ds)))


@pytest.mark.parametrize("n, batch_size, drop_last, sizes", [
    (23, 5, False, [5, 5, 5, 5, 3]),
    (23, 5, True, [5, 5, 5, 5]),
    (20, 5, False, [5, 5, 5, 5]),
    (20, 5, True, [5, 5, 5, 5]),
    (3, 8, False, [3]),
])
def test_batches_cover_every_sample_once(n, batch_size, drop_last, sizes):
    loader = DataLoader(indexed_dataset(n), batch_size, seed=2, drop_last=drop_last)
    assert len(loader) == loader.steps_per_epoch == len(sizes) and loader.last_batch_size == sizes[-1]
    for epoch in range(2):
        batches = list(loader.epoch(epoch))
        assert [len(y) for _, y in batches] == sizes
        seen = np.concatenate([np.rint(x[:, 0, 0, 0] * 255).astype(int) for x, _ in batches])
        np.testing.assert_array_equal(seen, loader.order(epoch)[:sum(sizes)])
        if not drop_last:
            assert sorted(seen) == list(range(n))
        else:
            assert len(set(seen)) == len(seen)


def test_batches_are_float32_nhwc_contiguous_with_int64_labels():
    x, y = next(DataLoader(indexed_dataset(), 4).epoch(0))
    assert x.dtype == np.float32 and x.flags.c_contiguous and x.shape == (4, 5, 6, 3)
    assert y.dtype == np.int64 and y.shape == (4,)


def test_resumed_epoch_and_random_access_batches_are_identical():
    ds = indexed_dataset()
    loader = DataLoader(ds, 4, seed=11, augment=Augment(crop_padding=2, hflip=True))
    full_run = [list(loader.epoch(e)) for e in range(3)]
    resumed = list(DataLoader(ds, 4, seed=11, augment=Augment(crop_padding=2, hflip=True)).epoch(2))
    for (xa, ya), (xb, yb) in zip(full_run[2], resumed):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    xb, yb = loader.batch(2, 3)
    np.testing.assert_array_equal(xb, full_run[2][3][0])
    assert not np.array_equal(full_run[0][0][0], full_run[1][0][0])


# ---------------------------------------------------------------- normalisation and augmentation vs numpy

LOADER_CASES = [
    dict(),
    dict(mean=0.5, std=0.25),
    dict(mean=(0.1, 0.2, 0.3), std=(0.5, 0.6, 0.7)),
    dict(augment=Augment(crop_padding=2)),
    dict(augment=Augment(hflip=True)),
    dict(augment=Augment(crop_padding=3, hflip=True), mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.4)),
    dict(augment=Augment(crop_padding=1, hflip=True), shuffle=False),
]


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("options", LOADER_CASES, ids=repr)
def test_kernel_matches_numpy_reference(options, dtype):
    loader = DataLoader(indexed_dataset(dtype=dtype), 6, seed=5, **options)
    for epoch in range(2):
        for index, (x, y) in enumerate(loader.epoch(epoch)):
            expected_x, expected_y = reference_batch(loader, epoch, index)
            np.testing.assert_array_equal(y, expected_y)
            np.testing.assert_allclose(x, expected_x, rtol=1e-6, atol=1e-6)


def test_normalisation_values():
    x = np.array([0, 51, 255], np.uint8).reshape(3, 1, 1, 1)
    loader = DataLoader(ArrayDataset(x, np.zeros(3, int)), 3, shuffle=False, mean=0.2, std=0.4)
    batch, _ = loader.batch(0, 0)
    np.testing.assert_allclose(batch.ravel(), [-0.5, 0.0, 2.0], atol=1e-6)
    raw = DataLoader(ArrayDataset(x.astype(np.float32), np.zeros(3, int)), 3, shuffle=False).batch(0, 0)[0]
    np.testing.assert_array_equal(raw.ravel(), [0.0, 51.0, 255.0])


def test_augmentation_really_crops_and_flips():
    loader = DataLoader(indexed_dataset(n=64), 64, seed=3, augment=Augment(crop_padding=2, hflip=True))
    shift_y, shift_x, flip = loader.augment_draws(0, 0, 64)
    assert 0 < flip.sum() < 64
    assert set(shift_y) == set(shift_x) == {0, 1, 2, 3, 4}
    plain = DataLoader(indexed_dataset(n=64), 64, seed=3).batch(0, 0)[0]
    augmented = loader.batch(0, 0)[0]
    moved = [not np.array_equal(a, p) for a, p in zip(augmented, plain)]
    assert sum(moved) > 48
    centred = (shift_y == 2) & (shift_x == 2) & ~flip
    assert all(np.array_equal(a, p) for a, p, c in zip(augmented, plain, centred) if c)


def test_padding_is_black_before_normalisation():
    x = np.full((1, 2, 2, 1), 255, np.uint8)
    loader = DataLoader(ArrayDataset(x, np.zeros(1, int)), 1, mean=0.5, std=0.5, augment=Augment(crop_padding=2))
    for epoch in range(20):  # some epoch draws a corner crop that leaves the image entirely
        values = set(np.round(loader.batch(epoch, 0)[0].ravel(), 6))
        assert values <= {1.0, -1.0}
    assert any(-1.0 in loader.batch(e, 0)[0] for e in range(20))


BAD_LOADERS = [
    (dict(batch_size=0), ValueError, "batch_size as an integer >= 1; found 0"),
    (dict(batch_size=64, drop_last=True), ValueError, "yields no batches"),
    (dict(batch_size=4, seed=-1), ValueError, "seed as an integer >= 0"),
    (dict(batch_size=4, mean=(0.1, 0.2)), ValueError, "3 per-channel numbers"),
    (dict(batch_size=4, std=(1.0, 0.0, 1.0)), ValueError, "std > 0"),
    (dict(batch_size=4, augment=4), TypeError, "augment=Augment(...)"),
]


@pytest.mark.parametrize("options, error, fragment", BAD_LOADERS, ids=[b[2] for b in BAD_LOADERS])
def test_bad_loaders_raise_clear_errors(options, error, fragment):
    with pytest.raises(error) as info:
        DataLoader(indexed_dataset(), **options)
    assert fragment in str(info.value)


def test_bad_augment_and_batch_index():
    with pytest.raises(ValueError, match="crop_padding as an integer >= 0"):
        Augment(crop_padding=-1)
    with pytest.raises(IndexError, match="5 batches per epoch; found batch index 5"):
        DataLoader(indexed_dataset(), 5).batch(0, 5)
    with pytest.raises(ValueError, match="epoch as an integer >= 0"):
        DataLoader(indexed_dataset(), 5).order(-1)
    with pytest.raises(TypeError, match="expects an ArrayDataset"):
        DataLoader(np.zeros((4, 2, 2, 1)), 2)


# ---------------------------------------------------------------- sources

def test_digits_is_the_real_uci_set_with_a_stratified_split():
    train, val = digits()
    assert (len(train), len(val)) == (1438, 359)
    assert train.sample_shape == (8, 8, 1) and train.x.dtype == np.uint8 and train.num_classes == 10
    counts = np.bincount(np.concatenate([train.y, val.y]))
    np.testing.assert_array_equal(counts, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180])
    np.testing.assert_array_equal(np.bincount(val.y), np.round(counts * 0.2).astype(int))
    # first row of the UCI file is a "0"; pixels 0..16 are scaled by 255 // 16
    with _bundled_digits() as lines:
        first = np.array(lines.readline().split(","), dtype=int)
    all_x = np.concatenate([train.x, val.x])
    assert first[-1] == 0
    first_image = first[:64] * 255 // 16
    assert any(np.array_equal(part.x[0].ravel(), first_image) for part in (train, val))  # file order is kept
    assert set(np.unique(all_x)) <= {v * 255 // 16 for v in range(17)} and all_x.max() == 255


def _bundled_digits():
    from importlib import resources
    return gzip.open(resources.files("blueprint.task.data").joinpath("digits.csv.gz").open("rb"), "rt")


def test_digits_split_is_seeded():
    a_train, a_val = digits(seed=1)
    b_train, b_val = digits(seed=1)
    np.testing.assert_array_equal(a_val.x, b_val.x)
    assert not np.array_equal(digits(seed=2)[1].x, a_val.x)
    with pytest.raises(ValueError, match="0 < val_fraction < 1"):
        digits(val_fraction=1.0)


def _write_cifar(folder, records_per_file=2, seed=0):
    rng = np.random.default_rng(seed)
    written = {}
    for name in CIFAR_TRAIN_FILES + (CIFAR_TEST_FILE,):
        labels = rng.integers(0, 10, size=records_per_file, dtype=np.uint8)
        planes = rng.integers(0, 256, size=(records_per_file, 3, 32, 32), dtype=np.uint8)  # R, G, B planes
        with open(folder / name, "wb") as handle:
            for label, image in zip(labels, planes):
                handle.write(bytes([label]) + image.tobytes())
        written[name] = (planes, labels)
    return written


def test_cifar10_reads_the_official_binary_layout(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    written = _write_cifar(folder)
    for where in (folder, tmp_path):  # the folder itself or its parent
        train, test = cifar10(where)
        planes = np.concatenate([written[n][0] for n in CIFAR_TRAIN_FILES])
        np.testing.assert_array_equal(train.x, planes.transpose(0, 2, 3, 1))
        np.testing.assert_array_equal(train.y, np.concatenate([written[n][1] for n in CIFAR_TRAIN_FILES]))
        np.testing.assert_array_equal(test.x, written[CIFAR_TEST_FILE][0].transpose(0, 2, 3, 1))
        assert len(train) == 10 and len(test) == 2 and train.num_classes == 10
        # pixel (row 3, column 5) of image 0 is R, G, B from the three planes
        np.testing.assert_array_equal(test.x[0, 3, 5], written[CIFAR_TEST_FILE][0][0, :, 3, 5])


def test_cifar10_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_batch_1.bin not found") as info:
        cifar10(tmp_path)
    assert "test_batch.bin" in str(info.value)
    _write_cifar(tmp_path)
    (tmp_path / CIFAR_TEST_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="test_batch.bin not found"):
        cifar10(tmp_path)
    _write_cifar(tmp_path)
    with open(tmp_path / "data_batch_3.bin", "ab") as handle:
        handle.write(b"\x00" * 10)
    with pytest.raises(ValueError, match="records of 3073 bytes"):
        cifar10(tmp_path)


def test_synthetic_is_deterministic_balanced_and_learnable():
    ds = synthetic(200, (8, 8, 3), num_classes=4, seed=3)
    again = synthetic(200, (8, 8, 3), num_classes=4, seed=3)
    np.testing.assert_array_equal(ds.x, again.x)
    assert ds.x.dtype == np.uint8 and np.bincount(ds.y).tolist() == [50, 50, 50, 50]
    # nearest class mean (fit on half, scored on the other half) separates the classes
    flat = ds.x.reshape(len(ds), -1).astype(np.float64)
    means = np.stack([flat[:100][ds.y[:100] == k].mean(axis=0) for k in range(4)])
    predicted = np.argmin(((flat[100:, None, :] - means[None]) ** 2).sum(axis=-1), axis=1)
    assert (predicted == ds.y[100:]).mean() > 0.9
    with pytest.raises(ValueError, match="sample_shape"):
        synthetic(10, (8, 8))
