"""The all-reduces of a data-parallel step on the CUDA path: entries of the launch tape.

After the last gradient write and before the overflow check, the tape holds one all-reduce
(average) over the contiguous ``grads`` region; after the overflow check, one all-reduce (max) of
the overflow flag, so every replica skips the same steps (with the average taken first the flags
already agree; the max keeps that true if the check ever moves before the reduction, as bucketed
all-reduces overlapped with backward would need). Both run on the step's stream: eager replay
issues them on it, and graph capture records them into the same CUDA graph as the kernels (NCCL
supports stream capture; nccl4py takes the cuda.core ``GraphBuilder`` as the stream).

With ``sync_batchnorm`` (``torch.nn.SyncBatchNorm`` semantics), every training BatchNorm adds
all-reduces (sum) of its per-channel fp32 sums, on the same stream and so inside the same graph: in
the forward, of the batch sum and sum of squares, after their accumulation (a convolution's epilogue
or the BN statistics kernel) and before the apply, which then divides by the global count (the
local rows times the world size: every replica steps the same batch size, which the sampler's padding
guarantees; every later reader of the saved sums takes that count, ``batchnorm_replicas``); in the
backward, of ``sum(dy)`` and ``sum(dy * xhat)`` after their reduction and before
the input gradient reads them (``cuda_kernels.batchnorm``). Two all-reduces per BN layer and
direction: the planner gives each buffer its own 256-byte-aligned slot, so the two are in general not
adjacent (one NCCL group call around them would make them one launch; not done yet).

``StepCollectives`` is the interface `cuda_kernels._ops` calls (``record_optimizer`` and the BN
launches); ``SINGLE_REPLICA`` (one process) records nothing. ``NcclCollectives`` is the real one:
an nccl4py communicator bootstrapped with the NCCL unique id that rank 0 broadcasts through the
torch.distributed (gloo) group. ``RecordingCollectives`` is its test double for the simulator: it
records each call and acts as ``world_size`` identical replicas (a sum multiplies the buffer by the
world size; an average or a max leaves it as it is; one replica, the default, changes nothing).

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
    """A tape entry: ``op`` ("avg", "max" or "sum") all-reduce of ``buffer`` in place, on the replay stream."""
    name: str
    op: str
    buffer: object
    communicator: object
    kind = "collective"

    def run(self, stream):
        self.communicator.all_reduce(self.buffer, self.op, stream)


class StepCollectives:
    """Where a data-parallel step talks to the other replicas (record time: ``launcher`` is the tape)."""

    world_size = 1
    sync_batchnorm = False

    def gradients(self, launcher, grads) -> None:
        """Between the last gradient write and the overflow check."""

    def overflow(self, launcher, flag) -> None:
        """Between the overflow check and the optimizer update."""

    def batchnorm_sums(self, launcher, what: str, *sums) -> int:
        """Between a BatchNorm's per-channel fp32 ``sums`` and their first reader: with ``sync_batchnorm``,
        each summed over the replicas in place. Returns how many replicas' rows the sums then hold."""
        return self.batchnorm_replicas()

    def batchnorm_replicas(self) -> int:
        """How many replicas' rows a BatchNorm's synchronised sums hold: what a reader of the forward's saved sums
        divides by (with the local rows), before or after ``batchnorm_sums``."""
        return self.world_size if self.sync_batchnorm else 1


SINGLE_REPLICA = StepCollectives()


class ReducingCollectives(StepCollectives):
    def gradients(self, launcher, grads) -> None:
        launcher.add(CollectiveEntry(f"all_reduce_avg_{GRADIENTS}", "avg", grads, self))

    def overflow(self, launcher, flag) -> None:
        launcher.add(CollectiveEntry(f"all_reduce_max_{OVERFLOW}", "max", flag, self))

    def batchnorm_sums(self, launcher, what: str, *sums) -> int:
        if self.sync_batchnorm:
            for buffer in sums:
                launcher.add(CollectiveEntry(f"all_reduce_sum_{what}", "sum", buffer, self))
        return self.batchnorm_replicas()

    def all_reduce(self, buffer, op: str, stream) -> None:
        raise NotImplementedError


@dataclass
class RecordingCollectives(ReducingCollectives):
    """The simulator's stand-in for NCCL: ``world_size`` identical replicas (see the module header);
    remembers ``(op, elements, dtype)`` per call."""
    calls: list = field(default_factory=list)
    world_size: int = 1
    sync_batchnorm: bool = False

    def all_reduce(self, buffer, op: str, stream) -> None:
        self.calls.append((op, int(buffer.size), np.dtype(buffer.dtype).name))
        if op == "sum" and self.world_size != 1:
            buffer.copy_to_device(buffer.copy_to_host(stream=stream) * buffer.dtype.type(self.world_size),
                                  stream=stream)


class NcclCollectives(ReducingCollectives):
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
        self.ops = {"avg": NcclRedOp.AVG, "max": NcclRedOp.MAX, "sum": NcclRedOp.SUM}
        self.world_size, self.sync_batchnorm = dist.world_size, dist.sync_batchnorm

    def all_reduce(self, buffer, op: str, stream) -> None:
        self.communicator.allreduce(buffer, buffer, self.ops[op], stream=stream)


def device_gradient_reduction(executor, dist):
    """Install NCCL on ``executor`` (a CudaExecutor not yet stepped) and return the executor-level hook,
    which has nothing to do: the reduction is recorded into the tape by ``record_optimizer`` (and, with
    ``dist.sync_batchnorm``, the BN sums' by the BN launches)."""
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
