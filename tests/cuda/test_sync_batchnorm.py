"""Synchronised BatchNorm on the CUDA path (``sync_batchnorm=True``), checked in the simulator.

NCCL needs GPUs, so two stand-ins take its place (``cuda_kernels.collective``):
- ``RecordingCollectives(world_size=W)``: W identical replicas (a sum multiplies by W). A W = 2 sync-BN
  step on batch B must equal one process's step on B twice over; it checks the tape's order too.
- ``LockstepGroup`` (below): W executors, one Python thread each, of which only one runs at a time: a
  rank runs its step until a collective, where the last rank to arrive reduces every rank's buffer,
  as NCCL would. Each rank steps its own shard, so this tells synchronised BN (equal to one process on
  the concatenated shards) from per-replica BN (not equal: each normalises its own shard).

Tolerances: both sides run the same fp16 kernels from the same weights; only the order of fp32
additions differs (per shard then across ranks, against one batch), so a stored fp16 value can round
the other way: one unit in the last place, 2**-11 relative. Gradients and the updated state are
compared by the 2-norm of their difference relative to their own (as in test_executor.py, with its
floor of 1% of the largest norm), within ``SAME_KERNELS_TOL`` = 2**-10, two such units. Measured in
the simulator: synchronised BN 7.4e-8 (gradients) and 1.8e-9 (parameters and running statistics after
the step) on two ranks, 1.5e-7 and 1.9e-9 for identical replicas, losses equal; per-replica BN differs
by 1.0 (gradients) and 1.3 (running statistics), which the test requires to exceed
``PER_REPLICA_DIFFERENCE``, so that it cannot pass without the all-reduces. Mutations tried once:
dropping the BN all-reduces fails the tape, identical-replica and two-rank tests; dropping only the
backward's fails the two-rank test; dropping the ``1 / world_size`` share fails both step comparisons.
"""
import threading

import numpy as np
import pytest

from blueprint import BlockStyle, BluePrint, block, cbr, gap_fc, seq
from blueprint.optim import SGD, CrossEntropyLoss
from cuda_kernels import CudaExecutor
from cuda_kernels.collective import CollectiveEntry, RecordingCollectives, ReducingCollectives
from cuda_kernels.tape import device_span
from cuda_kernels.vector import one_element_name
from planner import ArchPlan
from planner.compiler import Compiler

pytestmark = [pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),   # simulator only
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

NET = BluePrint(seq(cbr(8, 3, 1, 1), block(8, BlockStyle.RESNET_3_3), gap_fc(3)), "sync_bn_net")
BN_LAYERS = 3                      # cbr's and the basic block's two
SHARD, HWC, CLASSES, LR, WORLD = 2, (4, 4, 3), 3, 0.05, 2
CHECK_SCALE = 2.0 ** 12            # a loss scale at which these tiny batches' gradients fit fp16
SAME_KERNELS_TOL = 2.0 ** -10
PER_REPLICA_DIFFERENCE = 0.1       # per-replica BN must miss the one-process step by more than this
STATISTICS_KERNELS = ("batchnorm_stats", "_bn_stats")   # the BN kernel; a convolution's epilogue (its name has this)
SECONDS = 600                      # a rank waiting longer at a collective has lost its peer


def _plan(batch, fuse=True):
    arch = ArchPlan.from_blueprint(NET, in_channels=HWC[2], fuse=fuse, amp=True)
    return Compiler(arch).compile({"train": (batch,) + HWC, "eval": (batch,) + HWC}, optimizer_state_slots=1)


def _executor(batch, collectives=None, fuse=True):
    ex = CudaExecutor(_plan(batch, fuse), CrossEntropyLoss(), SGD().lr(LR).momentum(0.9), seed=5, replay="eager",
                      init_loss_scale=CHECK_SCALE)
    if collectives is not None:
        ex.collectives = collectives
    return ex


def _data(samples, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((samples,) + HWC).astype(np.float32), rng.integers(0, CLASSES, samples)


def _error(got, want):
    """The largest 2-norm difference over the tensors, relative as in test_executor.assert_close."""
    norms = {k: float(np.linalg.norm(np.asarray(want[k], np.float64))) for k in want}
    floor = 1e-2 * max(norms.values())
    return max(float(np.linalg.norm(np.asarray(got[k], np.float64) - np.asarray(want[k], np.float64)))
               / max(norms[k], floor) for k in want)


def _step(ex, x, y):
    loss = ex.train_step(x, y, LR)
    assert not ex.skipped_last_step
    return {"loss": loss, "grads": ex.gradients(), "state": ex.state_dict()}


# ---- the tape: where the BN all-reduces sit -------------------------------------------------------------------
def _touches(entry, span):
    arrays = [entry.buffer] if isinstance(entry, CollectiveEntry) else \
        [a for a in entry.args if hasattr(a, "__cuda_array_interface__") or hasattr(a, "__array_interface__")]
    return any(a < span[1] and span[0] < b for a, b in map(device_span, arrays))


def _neighbours(entries, i):
    """The last kernel before entry ``i`` and the first after it that touch its buffer."""
    span = device_span(entries[i].buffer)
    before = [e.name for e in entries[:i] if e.kind == "kernel" and _touches(e, span)]
    after = [e.name for e in entries[i + 1:] if e.kind == "kernel" and _touches(e, span)]
    return one_element_name(before[-1]), one_element_name(after[0])   # a _vec8 kernel or its one-element twin


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_each_bn_all_reduces_its_sums_after_their_accumulation_and_before_their_first_reader(fuse):
    """Forward: after the sums (conv epilogue or BN statistics kernel), before the apply, whose count (the
    rows its mean and variance divide by) is the global one, as is the backward reduction's, which derives them
    again from the same sums; backward: after the reduction, before dx; all inside the captured segment."""
    collectives = RecordingCollectives(world_size=WORLD, sync_batchnorm=True)
    ex = _executor(SHARD, collectives, fuse)
    tape = ex._runner("train", "train").tape
    entries = list(tape)
    forward = [i for i, e in enumerate(entries) if e.name == "all_reduce_sum_bn_statistics"]
    backward = [i for i, e in enumerate(entries) if e.name == "all_reduce_sum_bn_gradient_sums"]
    assert len(forward) == len(backward) == 2 * BN_LAYERS, [e.name for e in entries if e.kind == "collective"]
    for i in forward:
        writer, reader = _neighbours(entries, i)
        assert any(name in writer for name in STATISTICS_KERNELS), (i, writer)
        assert reader in ("batchnorm_apply", "batchnorm_apply_residual"), (i, reader)
    for i in backward:
        assert _neighbours(entries, i) == ("batchnorm_backward_reduce", "batchnorm_backward_dx"), i
    rows = SHARD * HWC[0] * HWC[1]
    applies = [e for e in entries if one_element_name(e.name) in ("batchnorm_apply", "batchnorm_apply_residual")]
    updating = [e for e in applies if int(e.args[-1])]   # the training applies: they update the running statistics
    assert len(updating) == BN_LAYERS and {int(e.args[-5]) for e in applies} == {rows * WORLD}, \
        [(e.name, int(e.args[-5]), int(e.args[-1])) for e in applies]
    reduces = [e for e in entries if one_element_name(e.name) == "batchnorm_backward_reduce"]
    assert len(reduces) == BN_LAYERS and {int(e.args[-2]) for e in reduces} == {rows * WORLD}
    shares = [e for e in entries if e.name == "batchnorm_replica_share"]
    assert len(shares) == BN_LAYERS and {float(e.args[2]) for e in shares} == {1.0 / WORLD}
    assert max(backward) < [e.name for e in entries].index("all_reduce_avg_grads")
    _, captured, _ = tape.segments()
    assert sum(e.kind == "collective" for e in captured) == 4 * BN_LAYERS + 2     # + gradients and overflow flag


def test_per_replica_bn_records_no_bn_all_reduce():
    tape = _executor(SHARD, RecordingCollectives(world_size=WORLD))._runner("train", "train").tape
    assert [e.name for e in tape if e.kind == "collective"] == ["all_reduce_avg_grads", "all_reduce_max_overflow"]


def test_replicate_gives_a_cuda_executor_sync_bn_through_its_collectives(monkeypatch):
    """``replicate`` used to refuse it; now NCCL's collectives (here the stand-in) carry the flag into the tape."""
    from blueprint.distributed import Distributed, replicate
    from cuda_kernels import collective
    monkeypatch.setattr(Distributed, "start", lambda self: None)                       # no process group: one rank
    monkeypatch.setattr(Distributed, "broadcast", lambda self, array, what, source=0: array)
    monkeypatch.setattr(collective, "NcclCollectives", lambda dist: RecordingCollectives(
        world_size=dist.world_size, sync_batchnorm=dist.sync_batchnorm))
    ex = replicate(_executor(SHARD), Distributed(0, WORLD, sync_batchnorm=True))
    assert not hasattr(ex, "batchnorm_sums")      # the CPU path's hook
    names = [e.name for e in ex._runner("train", "train").tape if e.kind == "collective"]
    assert names.count("all_reduce_sum_bn_statistics") == 2 * BN_LAYERS
    assert names.count("all_reduce_sum_bn_gradient_sums") == 2 * BN_LAYERS


# ---- identical replicas ------------------------------------------------------------------------------------
def test_identical_replicas_with_sync_bn_step_as_one_process_on_their_batches_together():
    x, y = _data(SHARD)
    replica = _step(_executor(SHARD, RecordingCollectives(world_size=WORLD, sync_batchnorm=True)), x, y)
    whole = _step(_executor(SHARD * WORLD), np.concatenate([x] * WORLD), np.concatenate([y] * WORLD))
    np.testing.assert_allclose(replica["loss"], whole["loss"], rtol=SAME_KERNELS_TOL)
    assert _error(replica["grads"], whole["grads"]) <= SAME_KERNELS_TOL
    assert _error(replica["state"], whole["state"]) <= SAME_KERNELS_TOL


# ---- two ranks on different shards ---------------------------------------------------------------------------
class LockstepGroup:
    """``world_size`` replicas in as many threads, one running at a time (the simulator's kernels are not
    made to run from two threads at once): a rank runs until its next collective and waits there; the last
    to arrive reduces every rank's buffer in place (fp64 on the host, as one NCCL all-reduce) and wakes them."""

    def __init__(self, world_size, sync_batchnorm):
        self.world_size = world_size
        self.turn = threading.Condition(threading.RLock())
        self.arrived, self.generation, self.failed = {}, 0, False
        self.ranks = [_LockstepRank(self, rank, sync_batchnorm) for rank in range(world_size)]

    def all_reduce(self, rank, buffer, op):
        with self.turn:
            self.arrived[rank] = buffer
            generation = self.generation
            if len(self.arrived) < self.world_size:
                if not self.turn.wait_for(lambda: self.generation != generation or self.failed, SECONDS) \
                        or self.failed:
                    raise RuntimeError(f"LockstepGroup: rank {rank} waited in vain at a {op} all-reduce")
                return
            values = np.stack([self.arrived[r].copy_to_host().astype(np.float64) for r in range(self.world_size)])
            reduced = {"sum": values.sum(0), "avg": values.mean(0), "max": values.max(0)}[op]
            for r in range(self.world_size):
                self.arrived[r].copy_to_device(reduced.astype(buffer.dtype))
            self.arrived.clear()
            self.generation += 1
            self.turn.notify_all()

    def run(self, jobs):
        """``jobs[r]()`` on rank ``r``'s thread; returns their results."""
        results, errors = [None] * len(jobs), []

        def main(rank):
            with self.turn:
                try:
                    results[rank] = jobs[rank]()
                except BaseException as error:   # re-raised on the test's thread below
                    errors.append(error)
                    self.failed = True
                    self.turn.notify_all()

        threads = [threading.Thread(target=main, args=(rank,), daemon=True) for rank in range(len(jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(SECONDS)
        if errors:
            raise errors[0]
        assert not any(thread.is_alive() for thread in threads), "a rank is still running"
        return results


class _LockstepRank(ReducingCollectives):
    def __init__(self, group, rank, sync_batchnorm):
        self.group, self.rank = group, rank
        self.world_size, self.sync_batchnorm = group.world_size, sync_batchnorm

    def all_reduce(self, buffer, op, stream):
        self.group.all_reduce(self.rank, buffer, op)


def _two_ranks(sync_batchnorm, x, y):
    group = LockstepGroup(WORLD, sync_batchnorm)
    ranks = [_executor(SHARD, collectives) for collectives in group.ranks]
    shards = [(x[r * SHARD:(r + 1) * SHARD], y[r * SHARD:(r + 1) * SHARD]) for r in range(WORLD)]
    return group.run([lambda ex=ex, shard=shard: _step(ex, *shard) for ex, shard in zip(ranks, shards)])


@pytest.fixture(scope="module")
def lockstep():
    x, y = _data(SHARD * WORLD, seed=3)
    return {"whole": _step(_executor(SHARD * WORLD), x, y),
            "sync": _two_ranks(True, x, y), "per_replica": _two_ranks(False, x, y)}


def test_two_ranks_with_sync_bn_step_as_one_process_on_their_shards_together(lockstep):
    whole = lockstep["whole"]
    for rank, got in enumerate(lockstep["sync"]):
        assert _error(got["grads"], whole["grads"]) <= SAME_KERNELS_TOL, rank
        assert _error(got["state"], whole["state"]) <= SAME_KERNELS_TOL, rank     # parameters and running stats
    np.testing.assert_allclose(np.mean([got["loss"] for got in lockstep["sync"]]), whole["loss"],
                               rtol=SAME_KERNELS_TOL)


def test_two_ranks_with_per_replica_bn_do_not(lockstep):
    """The same comparison fails without the BN all-reduces: the test above cannot pass by accident."""
    whole = lockstep["whole"]
    for got in lockstep["per_replica"]:
        assert _error(got["grads"], whole["grads"]) > PER_REPLICA_DIFFERENCE
    running = {k: v for k, v in lockstep["per_replica"][0]["state"].items() if "running" in k}
    assert _error(running, {k: whole["state"][k] for k in running}) > PER_REPLICA_DIFFERENCE
