"""`blueprint train --nproc-per-node N`: start N training workers through torch's own launcher.

The workers are the command torchrun would run, ``python -m blueprint train ...`` with the same
training options; `torch.distributed.run` (torchrun's code) sets each one's ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``, and a worker that sees them
trains as one data-parallel replica. One machine: a standalone rendezvous on a free local port.
Several machines: the same command on each with ``--nnodes M --rdzv-endpoint HOST:PORT``
(torchrun's c10d rendezvous; ``--rdzv-id`` names the job).

The rendezvous is bounded by ``--rdzv-timeout``: torchrun's own join and store timeouts are set to it,
and a watchdog (`blueprint._watchdog`) ends the launcher one grace period later if the rendezvous has still
not completed, because a connection to an endpoint that accepts but never answers blocks inside torch past
every timeout of its own. Either way the launcher prints one ``error:`` line and exits with status 2.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import threading

from blueprint._model_source import CliError
from blueprint._watchdog import watch

#: The launch options: they configure the launcher and are not passed on to the workers.
LAUNCH_OPTIONS = ("nproc_per_node", "nnodes", "rdzv_endpoint", "rdzv_id", "rdzv_timeout")
TORCHRUN_ENVIRONMENT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
DEFAULT_RDZV_TIMEOUT_S = 600       # torchrun's own default join timeout
#: torchrun's c10d rendezvous, registered under this name with `_watched_c10d` so the watchdog learns when
#: the rendezvous completed.
WATCHED_BACKEND = "blueprint-c10d"
_rendezvous_done = threading.Event()   # one launch per process: the CLI's


def add_launch_arguments(command) -> None:
    group = command.add_argument_group("several processes, GPUs or machines (torch.distributed: "
                                       "pip install \".[distributed]\" in the source tree)")
    group.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                       help="start N data-parallel workers on this machine through torch's launcher (torchrun); "
                            "--batch-size stays the global batch")
    group.add_argument("--nnodes", default="1", metavar="M",
                       help="machines taking part (torchrun's --nnodes; default %(default)s)")
    group.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                       help="rendezvous of a multi-machine run: the same HOST:PORT on every machine")
    group.add_argument("--rdzv-id", default="blueprint", metavar="ID",
                       help="the job's name at the rendezvous (default %(default)s)")
    group.add_argument("--rdzv-timeout", type=_seconds, default=DEFAULT_RDZV_TIMEOUT_S, metavar="SECONDS",
                       help="how long the launcher waits at --rdzv-endpoint for every machine to join before it "
                            "stops with an error (default %(default)s)")
    group.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                       help="how long a worker waits for the others in a collective before the run stops with an "
                            "error (default 300)")
    group.add_argument("--sync-batchnorm", action="store_true",
                       help="BatchNorm statistics over the global batch (default: per worker, as DDP)")


def in_torchrun_worker() -> bool:
    """Whether this process is a worker torchrun (or --nproc-per-node) started."""
    return all(name in os.environ for name in TORCHRUN_ENVIRONMENT)


def launcher_arguments(args, worker_argv: list[str]) -> list[str]:
    """torchrun's command line for ``args``' launch options, running ``worker_argv`` as a module."""
    if args.nproc_per_node < 1:
        raise CliError(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
    seconds = math.ceil(args.rdzv_timeout)    # torchrun's rendezvous options take whole seconds
    where = (["--standalone"] if args.rdzv_endpoint is None else
             ["--rdzv-backend", WATCHED_BACKEND, "--rdzv-endpoint", args.rdzv_endpoint, "--rdzv-id", args.rdzv_id,
              "--rdzv-conf", f"join_timeout={seconds},read_timeout={seconds}"])
    if args.rdzv_endpoint is None and args.nnodes != "1":
        raise CliError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the same on every machine)")
    workers = args.nproc_per_node * int(args.nnodes) if args.nnodes.isdigit() else None   # not an elastic "1:4"
    if workers and args.batch_size % workers:
        raise CliError(f"--batch-size {args.batch_size} is the global batch and does not divide over the {workers} "
                       f"workers (--nproc-per-node {args.nproc_per_node} x --nnodes {args.nnodes}); pass a multiple "
                       f"of {workers}, e.g. --batch-size {max(workers, args.batch_size - args.batch_size % workers)}")
    return ["--nproc-per-node", str(args.nproc_per_node), "--nnodes", args.nnodes, *where,
            "--module", "blueprint", *worker_argv]


def worker_arguments(command, args) -> list[str]:
    """The `blueprint train` options of ``args`` minus the launch options, as a command line."""
    argv = ["train"]
    for action in command._actions:
        if not action.option_strings or action.dest in LAUNCH_OPTIONS + ("help",):
            continue
        value = getattr(args, action.dest)
        if action.nargs == 0:          # a flag
            argv += [action.option_strings[-1]] if value else []
        elif value is not None:
            argv += [action.option_strings[-1], str(value)]
    return argv


def launch_workers(command, args) -> int:
    """Run the workers through `torch.distributed.run` and return the launcher's exit status."""
    try:
        from torch.distributed.elastic import rendezvous
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import main as torchrun
    except ImportError as error:
        raise CliError(f"--nproc-per-node needs torch.distributed: pip install \".[distributed]\" "
                       f"in the blueprint-nn source tree ({error})") from error
    os.environ.setdefault("OMP_NUM_THREADS", "1")    # the workers share the cores (numba: see Distributed.start)
    rendezvous.rendezvous_handler_registry.register(WATCHED_BACKEND, _watched_c10d)
    if args.rdzv_endpoint is not None:
        # os._exit at the deadline: the main thread is blocked inside torch, and no worker was started yet
        watch(_rendezvous_done, args.rdzv_timeout, lambda: rendezvous_failed(args))
    try:
        torchrun(launcher_arguments(args, worker_arguments(command, args)))
    except ChildFailedError as error:
        print(f"error: a training worker failed (exit status {next(iter(error.failures.values())).exitcode}); its "
              "error is above, prefixed with its rank", file=sys.stderr)
        return 1
    except rendezvous.RendezvousError as error:
        raise CliError(rendezvous_failed(args, error)) from None
    finally:
        _rendezvous_done.set()
    return 0


def rendezvous_failed(args, cause: Exception | None = None) -> str:
    """The one-line error of a rendezvous that did not complete: what, where, the fix."""
    text = " ".join(str(cause).split())[:200]
    why = "" if cause is None else f" ({type(cause).__name__}{': ' + text if text else ''})"
    return (f"the rendezvous at --rdzv-endpoint {args.rdzv_endpoint} did not complete within --rdzv-timeout "
            f"{args.rdzv_timeout:g} s{why}: no rendezvous answered there, or not every one of the --nnodes "
            f"{args.nnodes} machines joined. Start the same command on every machine with the same --rdzv-endpoint "
            "(a free port on the first machine, reachable from the others), or raise --rdzv-timeout")


def _watched_c10d(params):
    """torchrun's c10d rendezvous handler, whose completed rendezvous stops the watchdog."""
    from torch.distributed.elastic import rendezvous
    c10d = rendezvous.RendezvousParameters("c10d", params.endpoint, params.run_id, params.min_nodes, params.max_nodes,
                                           params.local_addr, **params.config)
    return _SignallingRendezvous(rendezvous.rendezvous_handler_registry.create_handler(c10d))


class _SignallingRendezvous:
    """A rendezvous handler that sets `_rendezvous_done` when its first rendezvous completes; the rest is the
    wrapped handler's."""

    def __init__(self, handler):
        self._handler = handler

    def next_rendezvous(self):
        info = self._handler.next_rendezvous()
        _rendezvous_done.set()
        return info

    def get_backend(self) -> str:
        return WATCHED_BACKEND

    def __getattr__(self, name):
        return getattr(self._handler, name)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value
