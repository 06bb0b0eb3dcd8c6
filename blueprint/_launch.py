"""`blueprint train --nproc-per-node N`: start N training workers through torch's own launcher.

The workers are the command torchrun would run, ``python -m blueprint train ...`` with the same
training options; `torch.distributed.run` (torchrun's code) sets each one's ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``, and a worker that sees them
trains as one data-parallel replica. One machine: a standalone rendezvous on a free local port.
Several machines: the same command on each with ``--nnodes M --rdzv-endpoint HOST:PORT``
(torchrun's c10d rendezvous; ``--rdzv-id`` names the job).
"""
from __future__ import annotations

import argparse
import os
import sys

from blueprint._model_source import CliError

#: The launch options: they configure the launcher and are not passed on to the workers.
LAUNCH_OPTIONS = ("nproc_per_node", "nnodes", "rdzv_endpoint", "rdzv_id")
TORCHRUN_ENVIRONMENT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


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
    where = (["--standalone"] if args.rdzv_endpoint is None else
             ["--rdzv-backend", "c10d", "--rdzv-endpoint", args.rdzv_endpoint, "--rdzv-id", args.rdzv_id])
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
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import main as torchrun
    except ImportError as error:
        raise CliError(f"--nproc-per-node needs torch.distributed: pip install \".[distributed]\" "
                       f"in the blueprint-nn source tree ({error})") from error
    os.environ.setdefault("OMP_NUM_THREADS", "1")    # the workers share the cores (numba: see Distributed.start)
    try:
        torchrun(launcher_arguments(args, worker_arguments(command, args)))
    except ChildFailedError as error:
        print(f"error: a training worker failed (exit status {next(iter(error.failures.values())).exitcode}); its "
              "error is above, prefixed with its rank", file=sys.stderr)
        return 1
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value
