"""The `--out` folder of `blueprint train`: one run at a time, nothing truncated, nothing left behind.

- **Lock.** A run holds an exclusive `flock` on ``OUT/.lock`` (which holds its pid) for its
  whole life. A second run into the same folder is refused naming the holder's pid. The
  kernel drops the lock when its process dies, however it dies, so the lock of a killed run
  is simply taken over by the next one.
- **History.** Each run appends to ``OUT/history.jsonl``, one JSON object per epoch with a
  ``run`` id (UTC start time, pid, random tag); earlier runs' lines are never rewritten. A
  resumed run first appends the checkpoint's epochs that the file lacks (``restore_history``).
- **Earlier checkpoints kept.** A fresh run (not ``--resume``) into a folder holding an earlier
  run's ``checkpoint.safetensors`` / ``checkpoint.interrupted.safetensors`` keeps each under a
  second name with its UTC modification time (``checkpoint.20261203T181502Z.safetensors``) once
  this run has replaced it (``keep_earlier``), and says so.
- **Nothing left behind.** On exit the lock file is removed, and folders the run created are
  removed again if it wrote nothing into them (a run that fails before its first step leaves
  the file system as it found it).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

from blueprint._file_lock import LockHeld, acquire_lock, release_lock
from blueprint.task._checkpoint import name_the_file

LOCK_NAME = ".lock"
HISTORY_NAME = "history.jsonl"


class RunFolderError(ValueError):
    """The --out folder cannot be used for this run; the message says why and what to do."""


def new_run_id() -> str:
    """UTC start time, pid and a random tag (two runs of one process within a second still differ)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{os.getpid()}-{secrets.token_hex(3)}"


@contextmanager
def run_folder(path: Path):
    """Create (if needed) and lock ``path`` for the duration of the ``with`` block."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"--out {path} is a file, not a folder; pass a folder path (it is created if missing)")
    created = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = _lock(path / LOCK_NAME)
    except BaseException:
        _remove_if_empty(created)
        raise
    try:
        yield path
    finally:
        release_lock(path / LOCK_NAME, descriptor)
        _remove_if_empty(created)


def _lock(lock_path: Path) -> int:
    try:
        return acquire_lock(lock_path)
    except LockHeld as held:
        raise RunFolderError(f"run folder {lock_path.parent} is in use by another run (pid {held.holder}); wait for "
                             "it to finish or pass another --out") from None


def _remove_if_empty(created: list[Path]) -> None:
    for folder in created:           # deepest first
        try:
            folder.rmdir()
        except OSError:              # not empty (the run wrote something) or already gone
            return


def append_history(folder: Path, run_id: str, record: dict) -> None:
    """One epoch's line, tagged with the run; appended, never truncating earlier runs."""
    path = Path(folder) / HISTORY_NAME
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"run": run_id, **record}) + "\n")
    except OSError as error:
        name_the_file(error, path)
        raise


def restore_history(folder: Path, run_id: str, records: list[dict]) -> list[int]:
    """On resume: append the lines of the checkpoint's epochs after the file's last line (a run killed between
    an epoch's checkpoint save and its history line lost that line); earlier lines are never rewritten.
    Returns the epochs restored."""
    path = Path(folder) / HISTORY_NAME
    last_epoch, last_run = 0, run_id
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        if text and not text.endswith("\n"):   # a line torn by the kill: the next line starts on its own
            with open(path, "a", encoding="utf-8") as handle:
                handle.write("\n")
        for line in text.splitlines():
            try:
                entry = json.loads(line)
                last_epoch, last_run = int(entry["epoch"]), str(entry.get("run", run_id))
            except (ValueError, TypeError, KeyError):   # a line cut short by the kill: not an epoch
                continue
    missing = [record for record in records if record["epoch"] > last_epoch]
    for record in missing:
        append_history(folder, last_run, record)
    return [record["epoch"] for record in missing]


@contextmanager
def keep_earlier(paths):
    """Give each existing file of ``paths`` (an earlier run's checkpoints, which a fresh run would replace)
    a second name, ``NAME.<its UTC modification time>.safetensors``, for the ``with`` block; yields the list
    of names kept. A second name that still points at the unchanged file on exit (this run replaced
    nothing) is removed again, so a run that wrote no checkpoint leaves the folder as it found it."""
    links = []
    for path in map(Path, paths):
        if not path.is_file():
            continue
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(path.stat().st_mtime))
        kept = path.with_name(f"{path.stem}.{stamp}{path.suffix}")
        for n in range(2, 1000):
            if not kept.exists():
                break
            kept = path.with_name(f"{path.stem}.{stamp}-{n}{path.suffix}")
        try:
            os.link(path, kept)          # a second name: no copy, the atomic save replaces only the first
        except OSError:                  # a file system without hard links
            shutil.copy2(path, kept)
        links.append((path, kept))
    kept_names = []
    try:
        yield kept_names
    finally:
        for path, kept in links:
            if path.exists() and _same_content(path, kept):
                kept.unlink(missing_ok=True)
            else:
                kept_names.append(kept)


def _same_content(a: Path, b: Path) -> bool:
    sa, sb = a.stat(), b.stat()
    if (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino):
        return True
    return (sa.st_size, sa.st_mtime_ns) == (sb.st_size, sb.st_mtime_ns) and a.read_bytes() == b.read_bytes()
