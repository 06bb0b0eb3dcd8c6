"""Checkpoint files: one ``.safetensors`` file with every tensor and a JSON training state.

The state is stored as JSON text in the safetensors metadata under ``blueprint_state``
(next to ``blueprint_format``). Allowed state values:

- ``None``, ``bool``, ``str``, ``float`` (NaN and ±inf are written as Python's JSON
  extensions ``NaN`` / ``Infinity`` and read back), ``int`` of any size (JSON integers are
  exact in Python, so a 128-bit PCG64 state survives);
- ``list`` / ``tuple`` (read back as lists) and ``dict`` with ``str`` keys
  (``np.random.Generator(...).bit_generator.state`` is such a dict);
- numpy scalars (read back as the Python number) and ``np.ndarray`` (read back exactly,
  dtype and shape included, as ``{"__ndarray__": ...}`` with base64 bytes).

Integrity: the metadata also holds ``blueprint_data_sha256``, the SHA-256 of the data
section (every tensor's bytes as stored), and ``blueprint_header_sha256``, the SHA-256 of
the rest of the header (the tensor table: names, dtypes, shapes, offsets; the state; the
format; the data digest) written as canonical JSON. Loading recomputes both and refuses a
mismatch naming the file, and refuses a floating-point tensor holding NaN or ±inf, naming
the tensor. (A digest detects corruption and accidental edits; it is not a signature.)

Saving is atomic: the bytes go to a temporary file ``.NAME.*.tmp`` in the target's folder,
which is flushed, fsync'ed and then ``os.replace``d over the target, so an interrupted save
leaves the previous checkpoint untouched; the temporary file is removed if the save fails,
and orphans left by a killed process are removed by the next save of the same target.

One writer per checkpoint: `DeepLearningTask.fit()` (with ``.checkpoint(path)``) and ``save(path)`` hold
`checkpoint_lock`, an `flock` on ``.NAME.lock`` next to the file (`blueprint._file_lock`); a second process
saving to the same path is refused naming the holder's pid instead of overwriting the other's file.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as safetensors_load
from safetensors.numpy import save as safetensors_bytes

from blueprint._errors import ConfigError
from blueprint._file_lock import LockHeld, process_lock

STATE_KEY = "blueprint_state"
FORMAT_KEY = "blueprint_format"
DATA_DIGEST_KEY = "blueprint_data_sha256"
HEADER_DIGEST_KEY = "blueprint_header_sha256"
FORMAT_VERSION = "2"            # 2: integrity digests in the header
HEADER_LENGTH_BYTES = 8         # safetensors: little-endian u64 header length, JSON header, data
HEADER_ALIGNMENT = 8            # safetensors pads its JSON header with spaces to this multiple
MAX_HEADER_BYTES = 16 * 2**20   # header (tensor table + state): checked before it is read
HASH_CHUNK = 2**20
ARRAY_MARK = "__ndarray__"
CHECKPOINT_MODE = 0o644


class CheckpointIntegrityError(ValueError):
    """A checkpoint's bytes do not match its digests, or it holds non-finite tensors."""


def _encode(value, where: str):
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, np.generic) and not isinstance(value, np.void):
        return value.item()
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject or value.dtype.fields is not None:
            raise TypeError(f"checkpoint state {where}: arrays of dtype {value.dtype} cannot be stored; "
                            "use a numeric or bool dtype.")
        data = np.require(value, requirements="C")  # keeps 0-d arrays 0-d
        return {ARRAY_MARK: base64.b64encode(data.tobytes()).decode("ascii"),
                "dtype": data.dtype.str, "shape": list(data.shape)}
    if isinstance(value, (list, tuple)):
        return [_encode(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        if ARRAY_MARK in value:
            raise ValueError(f"checkpoint state {where}: the key {ARRAY_MARK!r} is reserved for arrays; rename it.")
        encoded = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"checkpoint state {where}: dict keys must be str; found {type(key).__name__} "
                                f"{key!r}. Convert keys with str().")
            encoded[key] = _encode(item, f"{where}[{key!r}]")
        return encoded
    raise TypeError(f"checkpoint state {where}: {type(value).__name__} is not storable; use None, bool, int, "
                    "float, str, list, tuple, dict with str keys, numpy scalars or numpy arrays.")


def _decode(value):
    if isinstance(value, list):
        return [_decode(item) for item in value]
    if isinstance(value, dict):
        if ARRAY_MARK in value:
            raw = base64.b64decode(value[ARRAY_MARK])
            return np.frombuffer(raw, dtype=np.dtype(value["dtype"])).reshape(tuple(value["shape"])).copy()
        return {key: _decode(item) for key, item in value.items()}
    return value


def save_checkpoint(path, tensors: dict[str, np.ndarray], state: dict) -> None:
    """Write ``tensors`` and ``state`` atomically to the ``.safetensors`` file ``path``.

    >>> import numpy as np, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "run.safetensors")
    >>> save_checkpoint(path, {"model.w": np.ones((2, 3), np.float32)}, {"epoch": 4, "seed": 2**100})
    >>> tensors, state = load_checkpoint(path)
    >>> tensors["model.w"].shape, state
    ((2, 3), {'epoch': 4, 'seed': 1267650600228229401496703205376})
    """
    path = Path(path)
    if not isinstance(state, dict):
        raise TypeError(f"save_checkpoint expects state as a dict; found {type(state).__name__}.")
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, np.ndarray):
            raise TypeError(f"save_checkpoint expects tensors as {{str: np.ndarray}}; found {name!r}: "
                            f"{type(tensor).__name__}.")
    bad = first_non_finite(tensors)
    if bad is not None:   # the loader would refuse the file: never write it (the previous one stays)
        raise CheckpointIntegrityError(f"{path} not saved: tensor {bad[0]!r} holds {bad[1]} NaN/Inf value(s), which "
                                       "load_checkpoint refuses; lower the learning rate or normalise the inputs")
    metadata = {STATE_KEY: json.dumps(_encode(state, "state")), FORMAT_KEY: FORMAT_VERSION}
    contiguous = {name: np.require(t, requirements="C") for name, t in tensors.items()}
    payload = memoryview(safetensors_bytes(contiguous, metadata=metadata))
    header, data = _split(payload)
    header["__metadata__"][DATA_DIGEST_KEY] = hashlib.sha256(data).hexdigest()
    header["__metadata__"][HEADER_DIGEST_KEY] = _header_digest(header)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % HEADER_ALIGNMENT)
    folder = _existing_folder(path)
    _remove_orphans(folder, path.name)
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(len(header_bytes).to_bytes(HEADER_LENGTH_BYTES, "little"))
            handle.write(header_bytes)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, CHECKPOINT_MODE)  # mkstemp makes 0600; a checkpoint is an ordinary file
        os.replace(temporary, path)
    except BaseException as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        if isinstance(error, OSError):
            name_the_file(error, path)
        raise
    _fsync_folder(folder)


@contextmanager
def checkpoint_lock(path):
    """Hold the lock of checkpoint ``path`` for the ``with`` block: a ConfigError naming the holder's pid if
    another process holds it (re-entrant within this process)."""
    path = Path(path)
    try:
        with process_lock(_existing_folder(path) / f".{path.name}.lock"):
            yield
    except LockHeld as held:
        raise ConfigError(f"checkpoint {path} is being written by another process (pid {held.holder}): two runs "
                          "saving to one path would overwrite each other. Wait for it to finish, or give this run "
                          "another checkpoint path") from None


def _existing_folder(path: Path) -> Path:
    """The folder of checkpoint ``path``, which must exist (a save never creates folders)."""
    if not path.parent.is_dir():
        raise FileNotFoundError(f"save_checkpoint: folder {path.parent} for {path.name} does not exist; create it "
                                "first.")
    return path.parent


def name_the_file(error: OSError, path) -> None:
    """Make ``error`` name ``path`` where it names no file: a failed write (e.g. on a full disk) names none,
    and the one-line error must say which file it could not write."""
    if error.filename is None:
        error.filename = str(path)


def _split(payload: memoryview) -> tuple[dict, memoryview]:
    """(header as a dict, data section) of safetensors bytes."""
    length = int.from_bytes(payload[:HEADER_LENGTH_BYTES], "little")
    header = json.loads(bytes(payload[HEADER_LENGTH_BYTES:HEADER_LENGTH_BYTES + length]))
    return header, payload[HEADER_LENGTH_BYTES + length:]


def _header_digest(header: dict) -> str:
    """SHA-256 of the header (tensor table and metadata) without the header digest itself, as canonical JSON."""
    metadata = {k: v for k, v in header.get("__metadata__", {}).items() if k != HEADER_DIGEST_KEY}
    canonical = {**{k: v for k, v in header.items() if k != "__metadata__"}, "__metadata__": metadata}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def _remove_orphans(folder: Path, name: str) -> None:
    """Temporary files of earlier saves of ``name`` that a killed process left behind."""
    for orphan in folder.glob(f".{name}.*.tmp"):
        try:
            orphan.unlink()
        except FileNotFoundError:
            pass


def _verify(path: Path, header: dict, data: memoryview) -> None:
    """Recompute both digests from the bytes read; raise naming the file on a mismatch."""
    metadata = header.get("__metadata__") or {}
    if _header_digest(header) != metadata.get(HEADER_DIGEST_KEY):
        raise CheckpointIntegrityError(
            f"{path}: the header (tensor table or training state) does not match its sha256 digest; the file "
            "was corrupted or edited. Use another checkpoint (e.g. the previous epoch's)")
    computed = hashlib.sha256(data).hexdigest()
    if computed != metadata.get(DATA_DIGEST_KEY):
        raise CheckpointIntegrityError(
            f"{path}: the tensor data does not match its sha256 digest (stored {metadata.get(DATA_DIGEST_KEY)}, "
            f"computed {computed}); the file was corrupted or edited. Use another checkpoint "
            "(e.g. the previous epoch's)")


def _read_once(path: Path) -> bytes:
    """The whole file from one open descriptor, its header length checked before anything else is read: what
    the tensors are parsed from and the digests computed over is one and the same snapshot, even while a
    save replaces the path."""
    with open(path, "rb") as handle:
        length = int.from_bytes(handle.read(HEADER_LENGTH_BYTES), "little")
        if length > MAX_HEADER_BYTES:
            raise ValueError(f"{path} is not a blueprint checkpoint: it is not a readable safetensors file (its "
                             f"header length, {length:,} bytes, is over the {MAX_HEADER_BYTES:,} a checkpoint's "
                             "header may have).")
        return length.to_bytes(HEADER_LENGTH_BYTES, "little") + handle.read()


def first_non_finite(tensors: dict[str, np.ndarray]) -> tuple[str, int] | None:
    """(name, count of NaN/Inf values) of the first floating-point tensor that is not finite, else None:
    the one check both a save and a load make."""
    for name, tensor in tensors.items():
        if np.issubdtype(tensor.dtype, np.floating) and not np.isfinite(tensor).all():
            return name, int(tensor.size - np.isfinite(tensor).sum())
    return None


def _check_finite(path: Path, tensors: dict[str, np.ndarray]) -> None:
    bad = first_non_finite(tensors)
    if bad is not None:
        raise CheckpointIntegrityError(
            f"{path}: tensor {bad[0]!r} holds {bad[1]} NaN/Inf value(s); weights or optimizer state that are not "
            "finite cannot be trained on. Resume from an earlier checkpoint (and lower the learning rate)")


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where folders cannot be opened."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def load_checkpoint(path) -> tuple[dict[str, np.ndarray], dict]:
    """Read a file written by :func:`save_checkpoint`: ``(tensors, state)``."""
    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.safetensors"))
        raise FileNotFoundError(f"checkpoint {path} is a folder, not a checkpoint file; pass a file in it"
                                + (f" ({', '.join(str(path / name) for name in inside)})" if inside else
                                   ", e.g. a run folder's checkpoint.safetensors (this folder has none)"))
    if path.exists() and not path.is_file():
        raise ValueError(f"checkpoint {path} is not a regular file (a pipe or device); pass a checkpoint file")
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist. Check the path, or train first to create it.")
    raw = _read_once(path)
    try:
        tensors = safetensors_load(raw)           # validates the header: offsets, dtypes, shapes
        header, data = _split(memoryview(raw))
        metadata = header.get("__metadata__") or {}
    except KeyError as error:   # a dtype safetensors knows and numpy has no type for: BF16, F8_E4M3, ...
        names = [name for name, entry in _split(memoryview(raw))[0].items()
                 if name != "__metadata__" and entry["dtype"] == error.args[0]]
        raise ValueError(f"{path}: tensor {names[0]!r} has dtype {error.args[0]}, which numpy cannot hold; a "
                         "blueprint checkpoint stores float32 (and integer) tensors. Convert the tensors to float32 "
                         "with the program that wrote the file") from None
    except (SafetensorError, OSError, ValueError, RecursionError) as error:
        raise ValueError(f"{path} is not a blueprint checkpoint: it is not a readable safetensors file "
                         f"({error}).") from error
    if STATE_KEY not in metadata:
        raise ValueError(f"{path} is a safetensors file but not a blueprint checkpoint: its metadata has no "
                         f"{STATE_KEY!r} entry (found keys {sorted(metadata)}). Was it written by save_checkpoint?")
    if metadata.get(FORMAT_KEY) != FORMAT_VERSION:
        raise ValueError(f"{path} has checkpoint format {metadata.get(FORMAT_KEY)!r}; this version reads "
                         f"format {FORMAT_VERSION!r} (format '1' predates integrity digests: re-create it with the "
                         "version that wrote it, or retrain).")
    _verify(path, header, data)
    _check_finite(path, tensors)
    try:
        state = _decode(json.loads(metadata[STATE_KEY]))
        if not isinstance(state, dict):
            raise TypeError(f"a JSON {type(state).__name__}, not an object")
        return tensors, state
    except (ValueError, RecursionError, TypeError, KeyError) as error:   # a crafted state, e.g. nested 100k deep
        raise ValueError(f"{path}: its training state is not a blueprint state ({type(error).__name__}: "
                         f"{str(error)[:80]}); the file "
                         "was written by another program") from None
