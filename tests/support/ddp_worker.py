"""One rank of the data-parallel tests (tests/cpu/test_distributed.py starts two of these).

    python tests/support/ddp_worker.py CASE OUT_DIR

RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment, as torchrun sets them.
Each case writes ``OUT_DIR/<case>-<rank>.npz`` (arrays) or prints what the test reads; the
comparisons themselves (tolerances included) are made by the test, from these arrays.

Cases:
- ``train``: ``steps`` then ``resume``, in one process group (each launch costs seconds of imports).
- ``steps``: three comparisons, each over STEPS steps at identical parameters (every side starts
  each step from the float64 reference's state rounded to float32; each keeps its optimizer state):
  ``mlp``: 2 ranks, no BN, vs one process on the full batch; ``ddp``: a CNN with per-replica BN vs
  `torch.nn.parallel.DistributedDataParallel` on the same shards; ``syncbn``: the same CNN with
  ``sync_batchnorm=True`` vs one process on the full batch. Per quantity it saves ours, PyTorch's
  float32 and the float64 reference.
- ``resume``: a 2-epoch run vs 1 epoch + resume from rank 0's checkpoint + 1 epoch: final state and
  history.
- ``killed``: rank 1 dies (os._exit) at its third step; rank 0 reports the error it got.
- ``stalled``: rank 1 stops answering at its third step, until rank 0 has stopped; rank 0 reports the
  timeout.
- ``bad_input``: rank 1's third batch holds a NaN; it reports its InputError and lives on until rank 0
  has stopped; rank 0 reports its error (rank 1 left the process group).

No outcome depends on how fast the machine is: the fault cases other than ``stalled`` run with a
collective timeout (NEVER_S) that cannot expire before the test gives up on the launch, so a rank that
stops was stopped by the fault, not by a timer; a rank that must outlive another waits for that one's
stop file (``OUT_DIR/rank<r>.stopped``) instead of sleeping a guessed time.
"""
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from blueprint import BluePrint, bn, conv, fc, gap, seq, silu, tanh
from blueprint.distributed import Distributed, DistributedError, replicate
from blueprint.optim import SGD, CrossEntropyLoss
from cpu_ref import CpuExecutor
from planner import ArchPlan
from planner.compiler import Compiler

STEPS = 3
GLOBAL_BATCH = 6
SMOOTHING = 0.1
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 1e-3
TIMEOUT_S = 20.0
STALL_TIMEOUT_S = 4.0     # case "stalled": the collective timeout rank 0 must stop after
NEVER_S = 3600.0          # a collective timeout far beyond the test's launch limit (150 s)
WAIT_LIMIT_S = 140.0      # how long a rank waits for another's stop file (a hang guard, under the launch limit)


def optimizer():
    return SGD().lr(LR).momentum(MOMENTUM).nesterov(True).weight_decay(WEIGHT_DECAY)


def torch_optimizer(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, nesterov=True, weight_decay=WEIGHT_DECAY)


# ---- the networks: ours and PyTorch's, with the same parameter names ------------------------------------------
def mlp_blueprint():
    return BluePrint(seq(fc(16), tanh(), fc(10)))          # smooth: no activation kink to straddle


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 10)])

    def forward(self, x):
        x = x.reshape(x.shape[0], -1)
        for layer in self.layers:
            x = layer(x)
        return x


def cnn_blueprint():
    return BluePrint(seq(conv(6, 3, 1, 1), bn(), silu(), gap(), fc(10)))


class _Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Conv2d(3, 6, 3, 1, 1, bias=False), nn.BatchNorm2d(6), nn.SiLU(),
                                     nn.AdaptiveAvgPool2d(1), nn.Linear(6, 10)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x.flatten(1) if i == 4 else x)
        return x


NETWORKS = {"mlp": (mlp_blueprint, _Mlp, (1, 1, 12)), "cnn": (cnn_blueprint, _Cnn, (4, 4, 3))}


def ours_names(torch_state):
    return {k.replace("layers.", ""): v for k, v in torch_state.items()}


def torch_names(our_state):
    return {"layers." + k: v for k, v in our_state.items()}


def executor(network, batch, seed=3):
    make_bp, _, (h, w, c) = NETWORKS[network]
    plan = Compiler(ArchPlan.from_blueprint(make_bp(), in_channels=c)).compile(
        {"train": (batch, h, w, c), "eval": (batch, h, w, c)}, optimizer_state_slots=1)
    return CpuExecutor(plan, CrossEntropyLoss().label_smoothing(SMOOTHING), optimizer(), seed=seed)


def torch_step(net, opt, x, y):
    opt.zero_grad()
    logits = net(torch.tensor(x.transpose(0, 3, 1, 2)).to(next(net.parameters()).dtype))
    loss = F.cross_entropy(logits, torch.tensor(y), label_smoothing=SMOOTHING)
    loss.backward()
    module = net.module if hasattr(net, "module") else net
    grads = {n.replace("layers.", ""): p.grad.detach().double().numpy().copy() for n, p in module.named_parameters()}
    opt.step()
    return loss.item(), grads


def state_of(net):
    module = net.module if hasattr(net, "module") else net
    return {k: v.detach().double().numpy().copy() for k, v in ours_names(module.state_dict()).items()}


def load_torch(net, state):
    module = net.module if hasattr(net, "module") else net
    module.load_state_dict({k: torch.tensor(v) for k, v in torch_names(state).items()})


# ---- case "steps" ------------------------------------------------------------------------------------------------
def compare_steps(label, network, rank, world, reference_kind, sync_batchnorm, out):
    """STEPS steps of ours (a replica) against the float64 and float32 PyTorch sides, all starting each
    step at the reference's state. ``reference_kind``: "full" (one process, the global batch) or "ddp"
    (DistributedDataParallel on this rank's shard)."""
    _, make_torch, (h, w, c) = NETWORKS[network]
    local = GLOBAL_BATCH // world
    ours = replicate(executor(network, local), Distributed(rank, world, TIMEOUT_S, sync_batchnorm))
    torch.manual_seed(0)
    reference = make_torch().double()
    load_torch(reference, ours.state_dict())
    torch32 = make_torch().float()
    if reference_kind == "ddp":
        # running statistics per replica, as ours: DDP's default would broadcast rank 0's before each forward
        reference = nn.parallel.DistributedDataParallel(reference, broadcast_buffers=False)
        torch32 = nn.parallel.DistributedDataParallel(torch32, broadcast_buffers=False)
    opts = {"reference": torch_optimizer(reference.parameters()), "torch32": torch_optimizer(torch32.parameters())}
    rng = np.random.default_rng(11)
    for step in range(STEPS):
        with torch.no_grad():
            module = reference.module if hasattr(reference, "module") else reference
            for value in module.state_dict().values():
                if value.is_floating_point():
                    value.copy_(value.float().double())
        start = state_of(reference)
        ours.load_state_dict({k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in start.items()})
        load_torch(torch32, {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in start.items()})
        x = rng.standard_normal((GLOBAL_BATCH, h, w, c)).astype(np.float32)   # the same on every rank
        y = rng.integers(0, 10, GLOBAL_BATCH)
        mine = slice(rank * local, (rank + 1) * local)
        torch_x, torch_y = (x[mine], y[mine]) if reference_kind == "ddp" else (x, y)
        loss = ours.train_step(np.ascontiguousarray(x[mine]), y[mine], LR)
        grads = ours.gradients()
        loss32, grads32 = torch_step(torch32, opts["torch32"], torch_x, torch_y)
        loss64, grads64 = torch_step(reference, opts["reference"], torch_x, torch_y)
        if reference_kind == "full":    # ours: this rank's mean; the reference: the global batch's
            loss = float(np.mean(all_values(loss, world)))
        record = {"loss": (loss, loss32, loss64)}
        for name in grads64:
            record["grad:" + name] = (grads[name], grads32[name], grads64[name])
        after, after32, after64 = ours.state_dict(), state_of(torch32), state_of(reference)
        for key in after64:
            record["after:" + key] = (after[key], after32[key], after64[key])
        for key, (a, b, ref) in record.items():
            for side, value in zip(("ours", "torch32", "reference"), (a, b, ref)):
                out[f"{label}/{step}/{key}/{side}"] = np.asarray(value, np.float64)


def all_values(value, world):
    tensor = torch.zeros(world, dtype=torch.float64)
    tensor[dist.get_rank()] = value
    dist.all_reduce(tensor)
    return tensor.numpy()


def case_steps(rank, world, out_dir):
    out = {}
    compare_steps("mlp", "mlp", rank, world, "full", False, out)
    compare_steps("ddp", "cnn", rank, world, "ddp", False, out)
    compare_steps("syncbn", "cnn", rank, world, "full", True, out)
    np.savez(out_dir / f"steps-{rank}.npz", **out)


# ---- case "resume" -----------------------------------------------------------------------------------------------
def task(epochs, checkpoint=None):
    from blueprint import dropout, relu
    from blueprint.task import DeepLearningTask
    from blueprint.task.data import Augment, synthetic
    bp = BluePrint(seq(conv(8, 3, 1, 1), bn(), relu(), gap(), dropout(0.25), fc(4)))
    train, val = synthetic(50, (6, 6, 3), num_classes=4), synthetic(21, (6, 6, 3), num_classes=4, draw=1)
    t = (DeepLearningTask().model(bp).optimizer(optimizer()).data(train=train, val=val, batch_size=8,
                                                                   augment=Augment(crop_padding=1, hflip=True))
         .epochs(epochs).seed(5).progress(False).distributed(timeout_s=TIMEOUT_S))
    return t.checkpoint(checkpoint) if checkpoint else t


def case_resume(rank, world, out_dir):
    straight = task(3)
    history = straight.fit()
    checkpoint = out_dir / "resume.safetensors"
    task(1, checkpoint).fit()
    dist.barrier()                                   # rank 0 has written the checkpoint
    resumed = task(3).resume(checkpoint)
    resumed_history = resumed.fit()
    out = {}
    for label, t, h in (("straight", straight, history), ("resumed", resumed, resumed_history)):
        for k, v in t.session().executor.state_dict().items():
            out[f"{label}/state/{k}"] = v
        out[f"{label}/history"] = np.array([[r.train_loss, r.train_accuracy, r.val_loss, r.val_accuracy] for r in h])
    from blueprint.task.data import synthetic
    metrics = resumed.evaluate(synthetic(21, (6, 6, 3), num_classes=4, draw=1))
    out["evaluate"] = np.array([metrics["loss"], metrics["top1"], metrics["samples"]])
    np.savez(out_dir / f"resume-{rank}.npz", **out)


# ---- faults -------------------------------------------------------------------------------------------------------
def fault_task():
    from blueprint.task import DeepLearningTask
    from blueprint.task.data import ArrayDataset
    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, 1, 1, 12)).astype(np.float32)
    y = rng.integers(0, 10, 48)
    return x, y, (DeepLearningTask().model(mlp_blueprint()).optimizer(optimizer())
                  .data(train=ArrayDataset(x, y), batch_size=8, normalize=None).epochs(2).seed(1).progress(False)
                  .distributed(timeout_s=NEVER_S))


def stop_file(out_dir, rank):
    return Path(out_dir) / f"rank{rank}.stopped"


def wait_until_stopped(out_dir, rank):
    """Poll for ``rank``'s stop file (written when its error was reported); True when it appeared."""
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not stop_file(out_dir, rank).exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def case_killed(rank, world, out_dir):
    _, _, t = fault_task()
    session = t.session()
    if rank == 1:
        submit = session.executor.submit_train_step

        def dies_at_third_step(*args):
            if session.executor.step_count == 2:
                os._exit(17)
            return submit(*args)
        session.executor.submit_train_step = dies_at_third_step
    report(t, rank, out_dir)


def case_stalled(rank, world, out_dir):
    _, _, t = fault_task()
    t = t.distributed(timeout_s=STALL_TIMEOUT_S)
    session = t.session()
    if rank == 1:
        submit = session.executor.submit_train_step

        def stalls_at_third_step(*args):
            if session.executor.step_count == 2:
                wait_until_stopped(out_dir, 0)
                os._exit(0)
            return submit(*args)
        session.executor.submit_train_step = stalls_at_third_step
    report(t, rank, out_dir)


def case_bad_input(rank, world, out_dir):
    x, y, t = fault_task()
    loader = t._loaders()[0]
    if rank == 1:     # a NaN in rank 1's third batch (its loader's shard of the epoch's permutation)
        x[loader.order(0)[2 * loader.batch_size]] = np.nan
    report(t, rank, out_dir, outlive=0 if rank == 1 else None)   # rank 1 lives on: rank 0 must not wait for it


def report(t, rank, out_dir, outlive=None):
    """Train; on an error print it with the time the rank took and write the rank's stop file; with
    ``outlive``, then stay alive until that rank has stopped too (and say whether it did)."""
    begin = time.monotonic()
    try:
        t.fit()
    except (DistributedError, ValueError) as error:
        print(f"rank {rank} stopped after {time.monotonic() - begin:.1f} s: {type(error).__name__}: {error}",
              flush=True)
        stop_file(out_dir, rank).touch()
        if outlive is not None:
            seen = wait_until_stopped(out_dir, outlive)
            print(f"rank {rank} was still alive when rank {outlive} stopped: {seen}", flush=True)
        sys.exit(3)
    print(f"rank {rank} finished", flush=True)


def case_train(rank, world, out_dir):
    Distributed.from_environment(TIMEOUT_S).start()
    case_steps(rank, world, out_dir)
    case_resume(rank, world, out_dir)


CASES = {"train": case_train, "killed": case_killed, "stalled": case_stalled, "bad_input": case_bad_input}

if __name__ == "__main__":
    case, out_dir = sys.argv[1], Path(sys.argv[2])
    CASES[case](int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), out_dir)
