"""The gradient all-reduce of a data-parallel step on the CUDA path: an entry of the launch tape.

After the last gradient write and before the overflow check, the tape holds one all-reduce
(average) over the contiguous ``grads`` region; after the overflow check, one all-reduce (max) of
the overflow flag, so every replica skips the same steps (with the average taken first the flags
already agree; the max keeps that true if the check ever moves before the reduction, as bucketed
all-reduces overlapped with backward would need). Both run on the step's stream: eager replay
issues them on it, and graph capture records them into the same CUDA graph as the kernels (NCCL
supports stream capture; nccl4py takes the cuda.core ``GraphBuilder`` as the stream).

``StepCollectives`` is the interface `cuda_kernels._ops.record_optimizer` calls; ``SINGLE_REPLICA``
(one process) records nothing. ``NcclCollectives`` is the real one: an nccl4py communicator
bootstrapped with the NCCL unique id that rank 0 broadcasts through the torch.distributed (gloo)
group. ``RecordingCollectives`` is its test double for the simulator: it records each call and, as
one replica, leaves the buffers as they are.

Why not torch's NCCL process group: its collectives run on the process group's own internal
stream, ordered after torch's *current* stream by events; recording them inside our capture would
mean wrapping our stream as torch's current stream and letting its internal stream join the
capture through events, which PyTorch documents only for captures made with torch.cuda.graph
(and has open bugs across capture boundaries). nccl4py issues ncclAllReduce on the stream we pass.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

GRADIENTS = "grads"
OVERFLOW = "overflow"


@dataclass(frozen=True)
class CollectiveEntry:
    """A tape entry: ``op`` ("avg" or "max") all-reduce of ``buffer`` in place, on the replay stream."""
    name: str
    op: str
    buffer: object
    communicator: object
    kind = "collective"

    def run(self, stream):
        self.communicator.all_reduce(self.buffer, self.op, stream)


class StepCollectives:
    """Where a data-parallel step talks to the other replicas (record time: ``launcher`` is the tape)."""

    def gradients(self, launcher, grads) -> None:
        """Between the last gradient write and the overflow check."""

    def overflow(self, launcher, flag) -> None:
        """Between the overflow check and the optimizer update."""


SINGLE_REPLICA = StepCollectives()


class _ReducingCollectives(StepCollectives):
    def gradients(self, launcher, grads) -> None:
        launcher.add(CollectiveEntry(f"all_reduce_avg_{GRADIENTS}", "avg", grads, self))

    def overflow(self, launcher, flag) -> None:
        launcher.add(CollectiveEntry(f"all_reduce_max_{OVERFLOW}", "max", flag, self))

    def all_reduce(self, buffer, op: str, stream) -> None:
        raise NotImplementedError


@dataclass
class RecordingCollectives(_ReducingCollectives):
    """The simulator's stand-in for NCCL: one replica; remembers ``(op, elements, dtype)`` per call."""
    calls: list = field(default_factory=list)

    def all_reduce(self, buffer, op: str, stream) -> None:
        self.calls.append((op, int(buffer.size), np.dtype(buffer.dtype).name))


class NcclCollectives(_ReducingCollectives):
    """nccl4py on the step's stream (GPU only; not run on the development machines, which have none)."""

    def __init__(self, dist):
        try:
            from nccl.core import Communicator, NcclRedOp, UniqueId, get_unique_id
        except ImportError as error:
            from blueprint._errors import ConfigError
            raise ConfigError(f"data-parallel training on CUDA needs nccl4py: pip install 'nccl4py[cu13]' "
                               f"({error})") from error
        # bytes(uid): nccl4py 0.6's ``UniqueId.as_bytes`` is a property (calling it raised TypeError)
        unique = np.frombuffer(bytes(get_unique_id()), np.uint8).copy() if dist.is_writer \
            else np.zeros(len(bytes(get_unique_id(empty=True))), np.uint8)
        dist.broadcast(unique, "NCCL unique id broadcast")
        self.communicator = Communicator.init(dist.world_size, dist.rank, UniqueId.from_bytes(unique.tobytes()))
        self.ops = {"avg": NcclRedOp.AVG, "max": NcclRedOp.MAX}

    def all_reduce(self, buffer, op: str, stream) -> None:
        self.communicator.allreduce(buffer, buffer, self.ops[op], stream=stream)


def device_gradient_reduction(executor, dist):
    """Install NCCL on ``executor`` (a CudaExecutor not yet stepped) and return the executor-level hook,
    which has nothing to do: the reduction is recorded into the tape by ``record_optimizer``."""
    if executor.runners_recorded():
        raise RuntimeError("replicate() must be called before the CudaExecutor records its first step")
    executor.collectives = NcclCollectives(dist)
    return _recorded_in_the_tape


def _recorded_in_the_tape(executor, launcher=None) -> None:
    """The CUDA path's gradients are reduced by the tape's collective entries, not at this call point."""


def select_local_device() -> None:
    """Each replica on its own GPU: LOCAL_RANK, as torchrun numbers the processes of one machine."""
    import os

    from numba import cuda
    cuda.select_device(int(os.environ.get("LOCAL_RANK", "0")))
