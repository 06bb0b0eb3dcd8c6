"""The process group of a data-parallel run, on `torch.distributed` (the optional extra `distributed`).

`Distributed` is a frozen value: the rank, the world size, the collective timeout and whether BN is
synchronised. The torch process group is always gloo: it carries the CPU path's all-reduces and
every small collective (metrics, broadcasts); the CUDA path's gradient all-reduce runs on NCCL on the
step's stream (`cuda_kernels.collective`), bootstrapped through this group.
`Distributed.from_environment()` reads what `torchrun` (and `blueprint train --nproc-per-node N`,
which starts the workers through torch's own launcher) sets: ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``.

Every collective works in place on numpy memory through a zero-copy `torch.from_numpy` view, so the
arena's gradient region is summed where it lies. A collective that fails (a peer process died, or
did not answer within the timeout) raises `DistributedError` naming this rank, the collective and
what to look for; it never hangs longer than the timeout. Starting the group is bounded by the same
timeout: a rank whose master (rank 0 at ``MASTER_ADDR:MASTER_PORT``) never answers, which blocks inside
torch past its own timeouts, is ended by a watchdog (`blueprint._watchdog`) with one ``error:`` line.
"""
from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from blueprint._errors import ConfigError
from blueprint._watchdog import deadline

BACKEND = "gloo"
DEFAULT_TIMEOUT_S = 300.0       # a collective that waits longer than this ends the run
ENVIRONMENT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MINIMUMS = {"rank": 0, "world_size": 1}   # the smallest valid value of each (and of its environment variable)
THREADS_VARIABLE = "NUMBA_NUM_THREADS"


class DistributedError(RuntimeError):
    """A collective of a data-parallel run failed: another rank stopped or timed out."""


def torch_distributed():
    """`torch.distributed`, or a ConfigError with the install command."""
    try:
        import torch.distributed as dist
    except ImportError as error:
        raise ConfigError(f"data-parallel training runs on torch.distributed: pip install \".[distributed]\" "
                          f"in the blueprint-nn source tree ({error})") from error
    return dist


@dataclass(frozen=True)
class Distributed:
    """One replica's place in a data-parallel run.

    >>> Distributed(rank=1, world_size=2).is_writer
    False
    """

    rank: int = 0
    world_size: int = 1
    timeout_s: float = DEFAULT_TIMEOUT_S
    sync_batchnorm: bool = False

    def __post_init__(self):
        for name, minimum in MINIMUMS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(f"Distributed({name}=...): expected an int >= {minimum}, found {value!r}")
        if not self.rank < self.world_size:
            raise ConfigError(f"Distributed: rank {self.rank} is outside world size {self.world_size}; "
                              "launch with torchrun, which numbers the ranks 0..WORLD_SIZE-1")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ConfigError(f"Distributed(timeout_s=...): expected a number of seconds > 0, found {self.timeout_s!r}")
        if not isinstance(self.sync_batchnorm, bool):
            raise TypeError(f"Distributed(sync_batchnorm=...): expected True or False, found {self.sync_batchnorm!r}")

    @staticmethod
    def from_environment(timeout_s: float = DEFAULT_TIMEOUT_S, sync_batchnorm: bool = False) -> "Distributed":
        """The rank and world size torchrun set in this process's environment."""
        missing = [name for name in ENVIRONMENT if name not in os.environ]
        if missing:
            raise ConfigError(f"distributed(): expected torchrun's environment variables {list(ENVIRONMENT)}, "
                              f"{missing} not set; launch with `torchrun --nproc-per-node N -m blueprint train ...`, "
                              "`blueprint train --nproc-per-node N ...` or torchrun running your script")
        values = {}
        for name, minimum in MINIMUMS.items():
            text = os.environ[name.upper()]
            if not (text.isascii() and text.isdigit()) or int(text) < minimum:
                raise ConfigError(f"distributed(): environment variable {name.upper()} must be an int >= {minimum}, "
                                  f"found {text!r}; launch with torchrun, which sets it")
            values[name.upper()] = int(text)
        return Distributed(values["RANK"], values["WORLD_SIZE"], timeout_s, sync_batchnorm)

    @property
    def is_writer(self) -> bool:
        """Rank 0 alone writes the console, the history and checkpoints."""
        return self.rank == 0

    # ---- the process group -------------------------------------------------------------------------------
    def start(self) -> None:
        """Join the process group (once per process), and give each local replica its share of the cores."""
        dist = torch_distributed()
        if dist.is_initialized():
            if (dist.get_rank(), dist.get_world_size()) != (self.rank, self.world_size):
                raise ConfigError(f"a process group of rank {dist.get_rank()} in world size {dist.get_world_size()} "
                                  f"is already running in this process, this task asks for rank {self.rank} of "
                                  f"{self.world_size}; use Distributed.from_environment()")
            return
        _share_cores()
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        try:
            # os._exit at the deadline (see blueprint._watchdog): no group, so no training state, exists yet
            with deadline(self.timeout_s, lambda: self._start_timed_out(where)):
                dist.init_process_group(BACKEND, rank=self.rank, world_size=self.world_size,
                                        timeout=timedelta(seconds=self.timeout_s))
        except dist.DistNetworkError as error:   # rank 0 cannot listen on MASTER_PORT, or a rank cannot reach it
            raise ConfigError(f"rank {self.rank} of {self.world_size}: the process group's store at MASTER_ADDR:"
                              f"MASTER_PORT {where} failed ({' '.join(str(error).split())[:200]}); another process "
                              "holds that port, or rank 0 is not listening there. Free the port or pick another "
                              "MASTER_PORT (the same for every rank)") from None
        atexit.register(_leave, dist)   # gloo aborts the interpreter's exit if its group is still up

    def _start_timed_out(self, where: str) -> str:
        return (f"rank {self.rank} of {self.world_size}: the process group at MASTER_ADDR:MASTER_PORT {where} did "
                f"not start within the timeout of {self.timeout_s:g} s: rank 0 (the master) did not answer there, or "
                f"not every one of the {self.world_size} ranks joined. Start rank 0 with the same MASTER_ADDR and "
                "MASTER_PORT, check that this machine reaches that address, or raise the timeout (blueprint train "
                "--timeout, distributed(timeout_s=...))")

    def stop(self) -> None:
        """Leave the process group: the other ranks' pending and next collectives fail at once (a closed
        connection) instead of waiting for the timeout. Called when this rank's training fails."""
        dist = torch_distributed()
        _leave(dist)

    # ---- collectives on numpy memory (in place, zero copy) ---------------------------------------------------
    def all_reduce_sum(self, array: np.ndarray, what: str) -> np.ndarray:
        dist = torch_distributed()
        self._collective(what, dist.all_reduce, _tensor(array), op=dist.ReduceOp.SUM)
        return array

    def all_reduce_max(self, array: np.ndarray, what: str) -> np.ndarray:
        dist = torch_distributed()
        self._collective(what, dist.all_reduce, _tensor(array), op=dist.ReduceOp.MAX)
        return array

    def broadcast(self, array: np.ndarray, what: str, source: int = 0) -> np.ndarray:
        self._collective(what, torch_distributed().broadcast, _tensor(array), src=source)
        return array

    def _collective(self, what: str, collective, *args, **kwargs) -> None:
        try:
            collective(*args, **kwargs)
        except RuntimeError as error:    # gloo: a closed connection, or no answer within the timeout
            cause = " ".join(str(error).split())[:300]
            raise DistributedError(
                f"rank {self.rank} of {self.world_size}: the {what} failed: {cause}. Another rank stopped (its own "
                f"error is in its output) or did not answer within {self.timeout_s:g} s; this rank stops too. Fix "
                "that rank's error and restart; the last checkpoint is in the run folder") from error


def _leave(dist) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _tensor(array: np.ndarray):
    import torch
    if not array.flags.c_contiguous:
        raise ValueError(f"a collective needs contiguous memory, got an array of shape {array.shape} with strides "
                         f"{array.strides}; pass the region's flat view")
    return torch.from_numpy(array)


def _share_cores() -> None:
    """numba's threads: the cores divided among the replicas on this machine, unless the user set them."""
    if THREADS_VARIABLE in os.environ:
        return
    import numba
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    numba.set_num_threads(max(1, min(numba.config.NUMBA_NUM_THREADS, (os.cpu_count() or 1) // max(local, 1))))
