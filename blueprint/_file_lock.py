"""Exclusive locks between processes: an `flock` on a lock file that holds the holder's pid.

The kernel drops a lock when its process dies, however it dies, so the lock of a killed holder is
simply taken over by the next process. The lock file is removed on release, before its descriptor is
closed, so a waiter that opened the old file sees it gone and retries on a new one. Used by the CLI's
run folder (``OUT/.lock``, `blueprint._run_folder`) and by checkpoint saving (`checkpoint_lock`).
"""
from __future__ import annotations

import fcntl
import os
import threading
from contextlib import contextmanager
from pathlib import Path

_held: dict[str, int] = {}              # lock path -> how many `with` blocks of this process hold it
_bookkeeping = threading.Lock()


class LockHeld(Exception):
    """Another process holds the lock; ``holder`` is the pid it wrote (or "unknown")."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def acquire_lock(lock_path: Path) -> int:
    """Take the lock (never waiting) and write this pid into it; returns the descriptor to release."""
    while True:
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(descriptor, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(descriptor)
            raise LockHeld(holder) from None
        try:
            current = os.stat(lock_path).st_ino
        except FileNotFoundError:
            current = None
        if current != os.fstat(descriptor).st_ino:   # the holder finished and removed it meanwhile: retry
            os.close(descriptor)
            continue
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"{os.getpid()}\n".encode("ascii"))
        return descriptor


def release_lock(lock_path: Path, descriptor: int) -> None:
    Path(lock_path).unlink(missing_ok=True)   # before closing: a waiter then sees the lock file gone
    os.close(descriptor)


@contextmanager
def process_lock(lock_path: Path):
    """Hold ``lock_path`` for the ``with`` block: exclusive between processes (`LockHeld` otherwise),
    re-entrant within this one (a checkpoint saved inside a `fit()` that holds its lock)."""
    key = os.path.abspath(lock_path)
    with _bookkeeping:
        descriptor = None if key in _held else acquire_lock(Path(key))
        _held[key] = _held.get(key, 0) + 1
    try:
        yield
    finally:
        with _bookkeeping:
            _held[key] -= 1
            if descriptor is not None:
                del _held[key]
                release_lock(Path(key), descriptor)
