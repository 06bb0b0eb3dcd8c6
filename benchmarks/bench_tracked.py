"""Memory and the ratios against PyTorch that the README quotes, tracked by asv over commits.

peakmem_*  the process's peak resident memory during one CPU training step (resnet20, batch 16) and
           during one compile (resnet50, batch 32, train and eval variants; planning only, no arena);
track_*    saved-for-backward bytes ours / PyTorch's (resnet20, batch 16, unfused fp32; `saved_bytes.py`),
           planned transient bytes / their lower bound (resnet50 train graph, batch 32; `planner_memory.py`),
           and the CPU training-step time ours / PyTorch's measured side by side in one process
           (the MLP at batch 128 and resnet20 at batch 16; `cpu_vs_torch.py`, which checks first that both
           give the same eval logits from the same weights).

Every setup() checks correctness first (a ratio of two wrong things is not a result). Run from the
repository root: `ASV_PYTHONPATH=$PWD asv run` (benchmarks/RESULTS.md, "Tracked over time with asv").
"""
from __future__ import annotations

import math

SMALL_BATCH = 16
COMPILE_BATCH = 32
RATIO_REPEATS = 5
# PyTorch's first resnet20 steps at batch 16 took ~2 s each on the 2-core development machine, then 0.35 s
# (measured with cpu_vs_torch.measure_side_by_side at warm-ups of 2 and 10): warm both sides up well
RATIO_WARMUP = 10
MLP_SHAPE = (128, 1, 1, 784)


def _resnet20_step():
    import numpy as np

    from blueprint import zoo
    from blueprint.optim import SGD
    from cpu_ref import CpuExecutor
    from planner import ArchPlan
    from planner.compiler import Compiler

    shape = (SMALL_BATCH, 32, 32, 3)
    plan = Compiler(ArchPlan.from_blueprint(zoo.resnet20())).compile({"train": shape, "eval": shape},
                                                                   optimizer_state_slots=1)
    plan.verify()
    executor = CpuExecutor(plan, optimizer=SGD().lr(0.01).momentum(0.9))
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, SMALL_BATCH)
    return executor, x, y


class TrainStepMemory:
    """Peak RSS of a process that compiled resnet20 and ran training steps on the CPU path."""

    timeout = 300

    def setup(self):
        self.executor, self.x, self.y = _resnet20_step()
        loss = self.executor.train_step(self.x, self.y, 0.01)   # also compiles (or loads) the kernels
        if not math.isfinite(loss) or not 0 < loss < 10:
            raise AssertionError(f"resnet20 step loss {loss}: expected a finite cross-entropy near ln(10)")

    def peakmem_train_step(self):
        self.executor.train_step(self.x, self.y, 0.01)


class CompileMemory:
    """Peak RSS of a process that compiles resnet50's plan (train and eval variants)."""

    def setup(self):
        from blueprint import zoo
        self.bp = zoo.resnet50()
        plan = self._compile()
        plan.verify()
        if plan.params_trainable != 25_557_032:   # torchvision's count
            raise AssertionError(f"resnet50 has {plan.params_trainable} parameters, expected 25,557,032")

    def _compile(self):
        from planner import ArchPlan
        from planner.compiler import Compiler
        shape = (COMPILE_BATCH, 224, 224, 3)
        return Compiler(ArchPlan.from_blueprint(self.bp)).compile({"train": shape, "eval": shape},
                                                                 optimizer_state_slots=1)

    def peakmem_compile(self):
        self._compile()


class MemoryRatios:
    """Ratios of bytes: deterministic for a commit, so asv tracks them as numbers (unit "ratio")."""

    unit = "ratio"
    timeout = 300

    def setup(self):
        from benchmarks import planner_memory, saved_bytes
        theirs = saved_bytes.torch_saved("resnet20", SMALL_BATCH)["excl_params"]
        ours, _, notes = saved_bytes.planner_saved("resnet20", SMALL_BATCH)
        if ours is None or theirs <= 0:
            raise AssertionError(f"saved-for-backward bytes unavailable: ours {ours}, PyTorch {theirs} ({notes})")
        self.saved = ours / theirs
        memory = planner_memory.transient_memory("resnet50", COMPILE_BATCH, fuse=False)
        planned, bound = memory.transient_planned_bytes, memory.transient_lower_bound_bytes
        if not 0 < bound <= planned:
            raise AssertionError(f"planned transient bytes {planned} below their lower bound {bound}")
        self.transient = planned / bound

    def track_saved_for_backward_ratio_vs_torch(self):
        return self.saved

    def track_transient_over_lower_bound(self):
        return self.transient


class CpuStepRatio:
    """Our CPU training step time / PyTorch's, timed alternately in this process (median of pairs)."""

    unit = "ratio"
    timeout = 600
    params = ["mlp", "resnet20"]
    param_names = ["model"]

    def setup(self, model):
        from benchmarks import cpu_vs_torch
        shape = MLP_SHAPE if model == "mlp" else (SMALL_BATCH, 32, 32, 3)
        # build checks that both sides give the same eval logits from the same weights
        self.ours, self.theirs = cpu_vs_torch.build(model, model, shape, "train")
        self.measure = cpu_vs_torch.measure_side_by_side

    def track_cpu_step_ratio_vs_torch(self, model):
        return self.measure(self.ours, self.theirs, RATIO_REPEATS, warmup=RATIO_WARMUP)[2]
