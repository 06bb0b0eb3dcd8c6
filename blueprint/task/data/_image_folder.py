"""Image folders (one subfolder per class, as torchvision's ``ImageFolder``) decoded once into a
uint8 cache that later runs memory-map.

Classes are the subfolder names in sorted order (label 0 is the first); hidden entries (``.name``)
are skipped, and so are files that are not JPEG or PNG by extension. Each image is decoded with
Pillow, converted to RGB (or grey with ``channels=1``) and brought to ``size`` by one of:

- ``"center_crop"`` (default): scaled (bilinear) so that it covers ``size``, then the centre cut out
  (torchvision's ``Resize`` + ``CenterCrop``): the aspect ratio is kept;
- ``"resize"``: stretched to ``size``.

The result is written as ``<key>.images.npy`` (N, H, W, C uint8), ``<key>.labels.npy`` and
``<key>.json`` (classes, files) in the cache folder, where ``key`` is a digest of the folder's
absolute path, the options and every file's name, size and modification time: a changed, added
or removed image makes a new cache, and an unchanged folder is never decoded again. The JSON file
is written last, so a cache interrupted while writing is not used. Images Pillow cannot decode,
or in a mode with no 8-bit colour meaning (16-bit, 32-bit integer or float pixels), are reported
by name: refused (the default), or skipped with a warning naming them (``on_error="skip"``).
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np

from blueprint.task.data._dataset import ArrayDataset

EXTENSIONS = (".jpg", ".jpeg", ".png")
MODES = ("center_crop", "resize")
ODD_PIXEL_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")   # no 8-bit colour meaning
CACHE_ENV = "BLUEPRINT_CACHE"
CACHE_DEFAULT = Path("~/.cache/blueprint-nn/image-folders")
NAMED_IN_ERRORS = 5          # bad images named in one message
PIL_MODE = {1: "L", 3: "RGB"}


def _size(size) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) and not isinstance(size, bool) else tuple(size)
    if len(pair) != 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in pair):
        raise ValueError(f"image_folder size expects a positive int or an (H, W) pair of them; found {size!r}.")
    return pair


def _listing(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """(class names, [(path relative to root, label)]) in a fixed order."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir() and not entry.name.startswith("."))
    if not classes:
        raise ValueError(f"image_folder({root}): expected one subfolder per class (e.g. {root}/cat/1.jpg, "
                         f"{root}/dog/2.png); found no subfolders")
    files = []
    for label, name in enumerate(classes):
        found = sorted(p.relative_to(root).as_posix() for p in (root / name).rglob("*")
                       if p.suffix.lower() in EXTENSIONS and p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(root).parts))
        if not found:
            raise ValueError(f"image_folder({root}): class folder {name!r} holds no JPEG or PNG image "
                             f"({', '.join(EXTENSIONS)}); add images or remove the folder")
        files += [(f, label) for f in found]
    return classes, files


def _cache_key(root: Path, files, size, mode: str, channels: int) -> str:
    digest = hashlib.sha256(json.dumps([str(root.resolve()), list(size), mode, channels]).encode())
    for relative, label in files:
        stat = (root / relative).stat()
        digest.update(f"{relative}\0{label}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:24]


def _decode(path: Path, size: tuple[int, int], mode: str, channels: int) -> np.ndarray:
    """One image as (H, W, C) uint8; raises ValueError saying what is wrong with it."""
    from PIL import Image, UnidentifiedImageError

    height, width = size
    try:
        with Image.open(path) as image:
            image.load()
            if image.mode in ODD_PIXEL_MODES:
                raise ValueError(f"pixel mode {image.mode} (16-bit, 32-bit or float) has no 8-bit colour meaning")
            image = image.convert(PIL_MODE[channels])
    except (UnidentifiedImageError, OSError, SyntaxError) as error:
        raise ValueError(f"Pillow cannot decode it ({error})") from error
    if mode == "center_crop":
        scale = max(width / image.width, height / image.height)
        covering = (max(width, round(image.width * scale)), max(height, round(image.height * scale)))
        image = image.resize(covering, Image.Resampling.BILINEAR)
        left, top = int(round((covering[0] - width) / 2.0)), int(round((covering[1] - height) / 2.0))
        image = image.crop((left, top, left + width, top + height))
    else:
        image = image.resize((width, height), Image.Resampling.BILINEAR)
    return np.asarray(image, dtype=np.uint8).reshape(height, width, channels)


def _save(path: Path, array: np.ndarray) -> None:
    """Write one .npy file atomically (a temporary name, then a rename)."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        np.save(handle, array, allow_pickle=False)
    os.replace(temporary, path)


def _write_cache(folder: Path, key: str, root: Path, files, size, mode: str, channels: int, on_error: str) -> None:
    height, width = size
    folder.mkdir(parents=True, exist_ok=True)
    images = folder / f"{key}.images.npy"
    decoding = folder / f".{key}.decoding.npy"
    out = np.lib.format.open_memmap(decoding, mode="w+", dtype=np.uint8, shape=(len(files), height, width, channels))
    kept, labels, bad = [], [], []
    for relative, label in files:
        try:
            out[len(kept)] = _decode(root / relative, size, mode, channels)
        except ValueError as error:
            bad.append(f"{relative} ({error})")
            continue
        kept.append(relative)
        labels.append(label)
    out.flush()
    if bad and (on_error == "raise" or not kept):
        del out
        decoding.unlink()
        raise ValueError(f"image_folder({root}): {len(bad)} of {len(files)} images cannot be used: {_named(bad)}. "
                         "Remove or repair them, or pass on_error='skip' to train without them")
    if bad:   # only the images kept
        _save(images, out[:len(kept)])
        del out
        decoding.unlink()
    else:
        del out
        os.replace(decoding, images)
    _save(folder / f"{key}.labels.npy", np.asarray(labels, np.int64))
    record = folder / f".{key}.json.tmp"
    record.write_text(json.dumps({"root": str(root.resolve()), "files": kept, "skipped": bad}))
    os.replace(record, folder / f"{key}.json")


def _named(bad: list[str]) -> str:
    more = len(bad) - NAMED_IN_ERRORS
    return "; ".join(bad[:NAMED_IN_ERRORS]) + (f"; and {more} more" if more > 0 else "")


def image_folder(path, size, mode: str = "center_crop", channels: int = 3, cache_dir=None,
                 on_error: str = "raise") -> ArrayDataset:
    """The images under ``path`` (one subfolder per class) as a uint8 NHWC `ArrayDataset` of
    ``size`` (an int for square images, or (H, W)), memory-mapped from a cache decoded once.

    ``mode``: "center_crop" (keep the aspect ratio, cut the centre) or "resize" (stretch);
    ``channels``: 3 (RGB) or 1 (grey); ``cache_dir``: where the decoded cache lives (default
    ``$BLUEPRINT_CACHE`` or ``~/.cache/blueprint-nn/image-folders``); ``on_error``: "raise" (name
    every image that cannot be used) or "skip" (warn naming them, and leave them out).
    The dataset's ``classes`` are the subfolder names, in label order.

    >>> train = image_folder("photos/train", 64)                       # doctest: +SKIP
    >>> train.sample_shape, train.classes                              # doctest: +SKIP
    ((64, 64, 3), ('cat', 'dog'))
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"image_folder: {root} is not a folder; pass a folder with one subfolder per class")
    size = _size(size)
    if mode not in MODES:
        raise ValueError(f"image_folder mode expects one of {MODES}; found {mode!r}.")
    if channels not in PIL_MODE:
        raise ValueError(f"image_folder channels expects 1 (grey) or 3 (RGB); found {channels!r}.")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"image_folder on_error expects 'raise' or 'skip'; found {on_error!r}.")
    classes, files = _listing(root)
    folder = Path(cache_dir if cache_dir is not None else os.environ.get(CACHE_ENV) or CACHE_DEFAULT).expanduser()
    key = _cache_key(root, files, size, mode, channels)
    if not (folder / f"{key}.json").is_file():
        _write_cache(folder, key, root, files, size, mode, channels, on_error)
    record = json.loads((folder / f"{key}.json").read_text())
    if record["skipped"]:
        if on_error == "raise":   # a cache made with on_error="skip"
            raise ValueError(f"image_folder({root}): {len(record['skipped'])} images cannot be used: "
                             f"{_named(record['skipped'])}. Remove or repair them, or pass on_error='skip'")
        warnings.warn(f"image_folder({root}): left out {len(record['skipped'])} images that cannot be used: "
                      f"{_named(record['skipped'])}", stacklevel=2)
    x = np.load(folder / f"{key}.images.npy", mmap_mode="r")
    y = np.load(folder / f"{key}.labels.npy")
    return ArrayDataset(x, y, name=f"folder:{root.name}", num_classes=len(classes), classes=tuple(classes))
