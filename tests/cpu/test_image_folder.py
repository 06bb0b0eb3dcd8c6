"""Image folders: classes from subfolders, Pillow decoding to a size (centre crop or stretch),
a uint8 cache decoded once and memory-mapped afterwards, bad images named; validation_split;
ArrayDataset refusing channels-first batches. The images are made here with Pillow."""
import mmap
import os

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from blueprint.task.data import ArrayDataset, image_folder, validation_split  # noqa: E402
from blueprint.task.data import _image_folder  # noqa: E402

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)
JPEG_TOLERANCE = 8          # a solid colour survives JPEG within a few levels


def _stripes(width: int, height: int, colours) -> Image.Image:
    """Vertical stripes of equal width, left to right."""
    image = Image.new("RGB", (width, height))
    step = width // len(colours)
    for index, colour in enumerate(colours):
        image.paste(colour, (index * step, 0, (index + 1) * step, height))
    return image


@pytest.fixture()
def folder(tmp_path):
    root = tmp_path / "photos"
    (root / "b_green").mkdir(parents=True)
    (root / "a_red").mkdir()
    (root / ".hidden").mkdir()
    Image.new("RGB", (20, 12), RED).save(root / "a_red" / "one.png")
    Image.new("RGB", (9, 30), RED).save(root / "a_red" / "two.JPG", quality=95)
    Image.new("RGB", (16, 16), GREEN).save(root / "b_green" / "x.png")
    _stripes(60, 20, [RED, GREEN, BLUE]).save(root / "b_green" / "stripes.png")
    (root / "b_green" / "notes.txt").write_text("not an image, not listed")
    Image.new("RGB", (8, 8), BLUE).save(root / ".hidden" / "skip.png")
    return root


def test_classes_labels_shapes_and_colours(folder, tmp_path):
    data = image_folder(folder, (10, 10), cache_dir=tmp_path / "cache")
    assert data.classes == ("a_red", "b_green") and data.num_classes == 2
    assert data.x.shape == (4, 10, 10, 3) and data.x.dtype == np.uint8
    assert data.y.tolist() == [0, 0, 1, 1]          # sorted classes, sorted files: one.png, two.JPG, stripes, x
    assert (data.x[0] == RED).all()                                    # PNG: exact
    assert np.abs(data.x[1].astype(int) - RED).max() <= JPEG_TOLERANCE  # JPEG: within its loss
    assert (data.x[3] == GREEN).all()


def test_center_crop_keeps_the_middle_and_resize_stretches(folder, tmp_path):
    cropped = image_folder(folder, 10, cache_dir=tmp_path / "cache")
    stretched = image_folder(folder, 10, mode="resize", cache_dir=tmp_path / "cache")
    stripes = 2                                   # index of stripes.png
    assert (cropped.x[stripes][:, 3:7] == GREEN).all() and (cropped.x[stripes][:, 0] != RED).any()
    assert (stretched.x[stripes][:, 0] == RED).all() and (stretched.x[stripes][:, -1] == BLUE).all()


def _memory_mapped(array) -> bool:
    while array is not None:
        if isinstance(array, (np.memmap, mmap.mmap)):
            return True
        array = getattr(array, "base", None)
    return False


def test_the_cache_is_decoded_once_then_memory_mapped(folder, tmp_path, monkeypatch):
    first = image_folder(folder, 6, cache_dir=tmp_path / "cache")

    def no_decoding(*args):
        raise AssertionError("decoded again although nothing changed")

    monkeypatch.setattr(_image_folder, "_decode", no_decoding)
    again = image_folder(folder, 6, cache_dir=tmp_path / "cache")
    assert np.array_equal(first.x, again.x) and _memory_mapped(again.x)
    monkeypatch.undo()
    Image.new("RGB", (16, 16), BLUE).save(folder / "b_green" / "x.png")    # changed content: a new cache
    os.utime(folder / "b_green" / "x.png", ns=(1, 1))
    assert (image_folder(folder, 6, cache_dir=tmp_path / "cache").x[3] == BLUE).all()


def test_bad_images_are_named_and_skipped_on_request(folder, tmp_path):
    (folder / "a_red" / "broken.jpg").write_bytes(b"this is not a JPEG")
    Image.fromarray(np.full((4, 4), 40000, np.uint16)).save(folder / "b_green" / "deep.png")
    with pytest.raises(ValueError, match=r"2 of 6 images cannot be used: a_red/broken.jpg \(Pillow cannot decode.*"
                                         r"b_green/deep.png \(pixel mode I;16"):
        image_folder(folder, 4, cache_dir=tmp_path / "cache")
    with pytest.warns(UserWarning, match="left out 2 images.*broken.jpg.*deep.png"):
        data = image_folder(folder, 4, cache_dir=tmp_path / "cache", on_error="skip")
    assert len(data) == 4 and data.y.tolist() == [0, 0, 1, 1]


def test_folder_errors_say_what_to_do(tmp_path):
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(ValueError, match="class folder 'empty_class' holds no JPEG or PNG"):
        image_folder(tmp_path, 4, cache_dir=tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        image_folder(tmp_path / "missing", 4)


def test_validation_split_is_stratified_and_disjoint():
    x = np.arange(40, dtype=np.uint8).reshape(40, 1, 1, 1)
    y = np.repeat(np.arange(4), 10)
    train, val = validation_split(ArrayDataset(x, y, name="toy"), 0.3, seed=5)
    assert np.bincount(val.y).tolist() == [3, 3, 3, 3] and len(train) == 28
    assert sorted(train.x.ravel().tolist() + val.x.ravel().tolist()) == list(range(40))
    again = validation_split(ArrayDataset(x, y), 0.3, seed=5)[1]
    assert np.array_equal(again.x, val.x)


@pytest.mark.parametrize("shape", [(2, 3, 32, 32), (2, 1, 28, 28)])
def test_channels_first_batches_are_refused_with_the_transpose(shape):
    with pytest.raises(ValueError, match=r"channels-first.*x.transpose\(0, 2, 3, 1\)"):
        ArrayDataset(np.zeros(shape, np.uint8), np.zeros(2, np.int64))


@pytest.mark.parametrize("shape", [(2, 32, 32, 3), (2, 1, 1, 64), (2, 3, 3, 3)])
def test_nhwc_and_feature_vectors_are_still_accepted(shape):
    assert ArrayDataset(np.zeros(shape, np.uint8), np.zeros(2, np.int64)).sample_shape == shape[1:]
