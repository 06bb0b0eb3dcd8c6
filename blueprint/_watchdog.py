"""A deadline for a call that can block inside torch past every timeout of its own.

A connection to a peer that accepts and never answers (another program on the port, a wedged master)
blocks in torch's C++ store client, where neither a Python timeout nor a signal reaches the thread. `watch`
starts a daemon thread that, if the call has not finished `GRACE_S` seconds after its own timeout (torch's
timeouts fire first where they can), prints one ``error:`` line and ends the process with exit status 2.
It ends it with `os._exit` because the blocked thread cannot be unwound; so it guards only calls made
before any training state exists (nothing is lost). Used by the launcher's rendezvous (`blueprint._launch`)
and a worker's process-group start (`blueprint.distributed.Distributed.start`).
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager

GRACE_S = 5          # after the call's own timeout
EXIT_STATUS = 2      # a user error, as blueprint.cli reports one


def watch(done: threading.Event, timeout_s: float, message: Callable[[], str]) -> None:
    """Unless ``done`` is set within ``timeout_s`` + `GRACE_S` seconds, print ``error: message()`` on stderr
    and end the process with exit status 2."""
    def wait() -> None:
        if not done.wait(timeout_s + GRACE_S):
            print("error: " + message(), file=sys.stderr, flush=True)
            os._exit(EXIT_STATUS)
    threading.Thread(target=wait, name="blueprint-watchdog", daemon=True).start()


@contextmanager
def deadline(timeout_s: float, message: Callable[[], str]):
    """`watch` the ``with`` block: it ends (returns or raises) within ``timeout_s`` + `GRACE_S` seconds, or the
    process does, with ``error: message()``."""
    done = threading.Event()
    watch(done, timeout_s, message)
    try:
        yield
    finally:
        done.set()
