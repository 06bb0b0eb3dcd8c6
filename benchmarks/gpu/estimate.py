"""The dry run's estimate of a ``--quick`` GPU run (quick_run.py's units): a PREDICTION, every term printed.

It counts every kernel the warm-up JIT-compiles (the table's and every tensor-core kernel, side by side
in ``WORKERS`` processes on the GPU machine's CPUs), each unit's process start-up (Python, imports, a
CUDA context), and the units' own work from what the dry run measured on this CPU."""
import math
from dataclasses import dataclass

DEVICE_CPUS = 16             # the H200 machine (docs/gpu-runbook.md)
WORKERS = max(1, min(12, DEVICE_CPUS - 2))   # quick_run.PARALLEL there
TARGET_SHARE = 0.70          # the predicted run must fit in 70% of its budget
CONTEXT_S = 2.0              # a CUDA context and the first module loads in a new process (assumed)
TABLE_NVVM_TO_JIT = 3.0      # a table kernel's device JIT (NVVM, NVRTC shims, ptxas, nvJitLink LTO, load) / compile_ptx
MMA_LINK_LOAD = 1.5          # a tensor-core kernel's device JIT / (compile_ptx + ptxas measured here): LTO and load
CPU_JIT_COLD_S = 30.0        # numba's CPU kernels of step-check's fp32 reference on a cold cache (measured: 19.1 s)
PARENT_INIT_S = 12.0         # the parent: imports, PyTorch and its CUDA init, the versions record (assumed)
CHECK_WORK_S = 3.0           # one preflight check or tile case after its kernel loads from the cache (assumed)
TORCH_WARMUP_S = 15.0        # cudnn.benchmark's search and PyTorch eager's first steps (assumed)


@dataclass(frozen=True)
class Measured:
    """What the dry run measured on this CPU, in CPU seconds (a loaded machine stretches wall time, not these)."""
    table_compile_ptx: float     # compile_ptx of every table kernel, summed
    table_kernels: int
    mma_compile: float           # compile_ptx + ptxas of the representative (largest) tensor-core kernel
    mma_kernels: int
    child_start: float           # a new Python process importing the units' modules
    record: dict                 # {model: plan compile + verify + step recording}
    cpu_step: float              # step-check's fp32 CPU reference step
    checks: int                  # preflight checks + tile cases
    timed_s: float               # timing.TIMED_S
    replay_steps: int


def terms(m):
    """``[(what, seconds)]`` of the run, in its order."""
    start = m.child_start + CONTEXT_S
    jit = m.table_compile_ptx * TABLE_NVVM_TO_JIT + m.mma_kernels * m.mma_compile * MMA_LINK_LOAD
    waves = math.ceil(m.checks / WORKERS)
    check_model, time_model = list(m.record)[0], list(m.record)[-1]
    return [
        ("parent: imports, PyTorch CUDA init, versions record (assumed)", PARENT_INIT_S),
        (f"warm-up: JIT of {m.table_kernels} table kernels (compile_ptx here {m.table_compile_ptx:.1f} s x "
         f"{TABLE_NVVM_TO_JIT:g}) and {m.mma_kernels} tensor-core kernels ({m.mma_compile:.1f} s each: compile_ptx + "
         f"ptxas here x {MMA_LINK_LOAD:g}) over {WORKERS} processes, + one start-up",
         start + max(jit / WORKERS, m.mma_compile * MMA_LINK_LOAD)),
        (f"preflight + tiles: {m.checks} processes, {WORKERS} at a time ({waves} waves x (start-up {start:.1f} s + "
         f"{CHECK_WORK_S:g} s))", waves * (start + CHECK_WORK_S)),
        (f"step-check {check_model}: start-up, cold CPU JIT ({CPU_JIT_COLD_S:g} s), fp32 step x2 "
         f"({m.cpu_step:.1f} s here), 2 plans", start + CPU_JIT_COLD_S + 2 * m.cpu_step + 2 * m.record[check_model]),
        (f"graph-vs-eager {check_model}: start-up, plan + 3 executors x {m.replay_steps} steps",
         start + 3 * m.record[check_model] + 1.0),
        (f"step-timing {time_model}: start-up, 2 plans, ours eager + graph ({m.timed_s:g} s each + train_step), "
         f"PyTorch eager", start + 2 * m.record[time_model] + 4.5 * m.timed_s + TORCH_WARMUP_S),
        (f"breakdown {time_model}: start-up, plan, 2 warm-up steps, one timed step", start + m.record[time_model] + 2.0),
    ]


def quick_estimate(measured, budget_s):
    """``{"total_s", "share", "fits", "lines"}``: the run's predicted seconds against ``budget_s``."""
    rows = terms(measured)
    total = sum(seconds for _, seconds in rows)
    share = total / budget_s
    fits = share <= TARGET_SHARE
    lines = ["estimate of `python -m benchmarks.gpu.check --quick` on an H200 (a PREDICTION from this dry run, "
             "not a measurement):"]
    lines += [f"  {seconds:6.1f} s  {what}" for what, seconds in rows]
    lines.append(f"  {total:6.1f} s  total: {share:.0%} of the {budget_s:g} s budget, "
                 f"{'within' if fits else 'ABOVE'} the {TARGET_SHARE:.0%} target (torch.compile runs only with "
                 f"time left)")
    return {"total_s": total, "share": share, "fits": fits, "lines": lines, "terms": dict((w, s) for w, s in rows)}
