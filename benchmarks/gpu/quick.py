"""``benchmarks.gpu.check --quick``: the first run on a short-lived GPU, in this order, inside a 240 s budget
that counts every cold JIT compile:

    versions -> preflight (check.main: each GPU-only assumption alone, PASS / FAIL; preflight.py)
    -> compile (every kernel of the table, timed) -> step-check resnet20 (vs the fp32 CPU path)
    -> graph-vs-eager resnet20 -> step-timing resnet18-cifar b256 (ours eager + graph, PyTorch eager
    AMP channels_last) -> breakdown (per-kernel time of one step) -> torch.compile (only with time
    left) -> summary (the line to paste)

Each unit writes one JSON Lines record when it ends (``protocol.RecordWriter``). With
``--dry-run`` the same units run on the CPU: the compile unit compiles every kernel to PTX (the
source of the compile-time estimate), the step units compile their plans and record their steps as
the executor does, the breakdown runs the same timed replay over the recorded step's entries with
stand-in events (labelled), and the estimate of the GPU run is printed."""
import time
from types import SimpleNamespace

from cuda_kernels._registry import SIMULATOR

from .layers import format_layers, per_layer
from .protocol import (Unit, format_breakdown, paste_line, summed_by_kind, timed_replay, versions_line,
                            versions_record)
from .step_common import (CHECK_MODELS, MIB, REPLAY_MODELS, REPLAY_STEPS, SECTION_RESERVE_S, TIMED_S,
                               TIMING_LR, TIMING_MODELS, WARMUP_STEPS, compile_step_plan, release_device_memory,
                               sgd, step_batches)

QUICK_BUDGET_S = 240
QUICK_CHECK, QUICK_REPLAY, QUICK_TIMING = CHECK_MODELS[0], REPLAY_MODELS[0], TIMING_MODELS[0]
assert (QUICK_CHECK.name, QUICK_REPLAY.name, QUICK_TIMING.name) == ("resnet20", "resnet20", "resnet18-cifar")
# The estimate of a --quick GPU run (a prediction until a GPU run measures it; every term named):
NVVM_TO_DEVICE_JIT = 3.0     # device JIT (NVVM + ptxas + nvJitLink LTO + load) over the NVVM-only compile_ptx time
CPU_JIT_COLD_S = 30.0        # numba's CPU kernels of step-check on a cold cache (measured: a cold resnet20 first step took 19.1 s on a 2-core machine)
CUDA_INIT_S = 10.0           # CUDA context, cuda.core, PyTorch import and its CUDA init
TORCH_WARMUP_S = 15.0        # cudnn.benchmark's search and the first steps of PyTorch eager
PREFLIGHT_S = 10.0           # gpu_check's preflight (preflight.py): two tensor-core kernels' JIT, tiny launches


def write_versions(out, failures):
    with Unit(out, "versions", failures) as unit:
        record = versions_record()
        unit.fields.update(record)
        print(versions_line(record))


# ---- the compile unit ------------------------------------------------------------------------------------

def _compile_every_kernel(dry):
    """``{kernel: seconds}``: ``spec.compile()`` on the GPU (the cold JIT every later unit would
    pay), ``compile_ptx`` for sm_90 in the dry run (NVVM only; what the estimate scales)."""
    from cuda_kernels._registry import all_kernels
    seconds = {}
    if dry:
        from numba import cuda
        import numba.cuda.dispatcher as dispatcher
        saved = dispatcher.get_current_device    # device functions target the current device: say sm_90
        dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))
        try:
            for name, spec in all_kernels().items():
                started = time.perf_counter()
                cuda.compile_ptx(spec.pyfunc, spec.signature, cc=(9, 0))
                seconds[name] = time.perf_counter() - started
        finally:
            dispatcher.get_current_device = saved
        return seconds
    for name, spec in all_kernels().items():
        started = time.perf_counter()
        spec.compile()
        seconds[name] = time.perf_counter() - started
    return seconds


def _compile(out, failures, dry):
    with Unit(out, "compile", failures, status="dry" if dry else "ok") as unit:
        seconds = _compile_every_kernel(dry)
        total = sum(seconds.values())
        slowest = sorted(seconds.items(), key=lambda kv: -kv[1])[:5]
        what = "compile_ptx sm_90 on this CPU (NVVM only)" if dry else "cold JIT on the device (NVVM, ptxas, load)"
        print(f"  {len(seconds)} kernels, {what}: {total:.1f} s; slowest "
              + ", ".join(f"{k} {v:.1f} s" for k, v in slowest))
        unit.fields.update(kernels=len(seconds), total_s=total, what=what, per_kernel_s=seconds)
        return total


# ---- the GPU run -----------------------------------------------------------------------------------------

def run_quick(out, budget, failures, skipped, notes):
    """The --quick units on the GPU; returns the summary fields (the paste line's values)."""
    from cpu_ref import CpuExecutor
    from cuda_kernels import CudaExecutor
    from .steps import step_check_one, step_replay_one
    from .timing import format_timing_table, step_timing, torch_compile_column
    summary = {}
    _compile(out, failures, dry=False)
    for name, need, run in (
            (f"step-check {QUICK_CHECK.name}", SECTION_RESERVE_S,
             lambda: step_check_one(QUICK_CHECK, CpuExecutor, CudaExecutor, failures)),
            (f"graph-vs-eager {QUICK_REPLAY.name}", SECTION_RESERVE_S,
             lambda: step_replay_one(QUICK_REPLAY, CudaExecutor, failures))):
        if not budget.allows(need, name, skipped):
            out.write(name, "not-run", reason=skipped[-1])
            continue
        with Unit(out, name, failures) as unit:
            result = run()
            release_device_memory()
            unit.status = "ok" if result.get("ok") else "failed"
            unit.fields.update(result)
            if name.startswith("step-check"):
                summary["max_err"] = max([result.get("loss_error", float("inf"))] +
                                         [result[k]["worst"] for k in ("gradients", "updates", "BN stats")
                                          if k in result])
    rows = {}
    name = f"step-timing {QUICK_TIMING.name}"
    if budget.allows(2 * SECTION_RESERVE_S, name, skipped):
        with Unit(out, name, failures) as unit:
            rows = step_timing([QUICK_TIMING], budget, failures, skipped, notes, compile_torch=False)
            unit.fields.update(_timing_fields(rows.get(QUICK_TIMING.name, {})))
            summary.update(_timing_summary(rows.get(QUICK_TIMING.name, {})))
    else:
        out.write(name, "not-run", reason=skipped[-1])
    name = f"breakdown {QUICK_TIMING.name}"
    if budget.allows(SECTION_RESERVE_S, name, skipped):
        with Unit(out, name, failures) as unit:
            unit.fields.update(_gpu_breakdown(QUICK_TIMING, CudaExecutor))
    else:
        out.write(name, "not-run", reason=skipped[-1])
    name = f"torch.compile {QUICK_TIMING.name}"
    if rows:
        with Unit(out, name, failures) as unit:
            torch_compile_column(rows, budget, notes)
            result = rows[QUICK_TIMING.name].get("torch.compile", {})
            unit.status = "ok" if "seconds" in result else "not-run"
            unit.fields.update(result)
            print(format_timing_table(rows))
    return summary


def _timing_fields(row):
    return {key: value for key, value in row.items() if key != "model"}


def _timing_summary(row):
    """The paste line's timing values: ours in graph replay, or in eager replay if graph replay was not measured."""
    model = QUICK_TIMING
    ours, theirs = row.get("ours graph", {}), row.get("torch eager", {})
    if "seconds" not in ours and "seconds" in row.get("ours eager", {}):
        ours = dict(row["ours eager"], replay="eager")
    return {"ours_ips": model.batch / ours["seconds"] if "seconds" in ours else None,
            "replay": ours.get("replay", "graph"),
            "torch_ips": model.batch / theirs["seconds"] if "seconds" in theirs else None,
            "arena_mib": row["arena_bytes"] / MIB if "arena_bytes" in row else None,
            "torch_mib": theirs["peak_bytes"] / MIB if "peak_bytes" in theirs else None}


def _gpu_breakdown(model, CudaExecutor):
    """One training step of ``model`` replayed eagerly with CUDA events around each tape entry."""
    from numba import cuda
    plan = compile_step_plan(model)
    (x, y), = step_batches(model, 1)
    ex = CudaExecutor(plan, optimizer=sgd(), seed=0, replay="eager")
    for _ in range(WARMUP_STEPS):
        ex.train_step(x, y, TIMING_LR)          # records the step, loads every kernel
    key = next(k for k in ex._runners if k[1] == "train")
    ex._staging[key].begin({"input": x, "labels": y, "lr": TIMING_LR})
    entries = list(ex._runners[key].tape)
    # the simulator's events time nothing (elapsed_time is -1): its launches are synchronous, so a host clock
    # around each one stands in there, labelled so
    timed = timed_replay(entries, ex.stream, HostClockEvent if SIMULATOR else cuda.event)
    rows = summed_by_kind(timed)
    label = (f"{model.label}: STAND-IN times, a host clock around the CUDA simulator's launches, not a GPU's"
             if SIMULATOR else f"{model.label}, eager replay, CUDA events around each entry")
    print(format_breakdown(rows, label))
    layers = per_layer(entries, timed)
    print(format_layers(layers, label))
    del ex
    release_device_memory()
    return {"rows": [dict(name=n, launches=c, ms=ms, share=share) for n, c, ms, share in rows],
            "step_ms": sum(ms for _, _, ms in timed), "label": label, "layers": layers, "layers_label": label}


class HostClockEvent:
    """A CUDA event's stand-in for the simulator, whose launches run to completion before they return."""

    def record(self, stream=0):
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.at - self.at) * 1e3


# ---- the dry run -----------------------------------------------------------------------------------------

def dry_run_quick(out, failures):
    """The --quick units on the CPU (no device, no simulator); prints the GPU run's estimate."""
    from .dry import EventStandIn, dry_record_train_step, dry_run_torch
    measured = {}
    measured["compile"] = _compile(out, failures, dry=True)
    plans, launches, orders, entries = {}, {}, {}, {}
    for name, model in ((f"step-check {QUICK_CHECK.name}", QUICK_CHECK),
                        (f"graph-vs-eager {QUICK_REPLAY.name}", QUICK_REPLAY),
                        (f"step-timing {QUICK_TIMING.name}", QUICK_TIMING)):
        with Unit(out, name, failures, status="dry") as unit:
            started = time.perf_counter()
            plan = plans[model.name] = compile_step_plan(model)
            plan.verify()
            names, _, orders[model.name], entries[model.name] = dry_record_train_step(plan, sgd())
            launches[model.name] = len(names)
            measured[f"record {model.name}"] = time.perf_counter() - started
            print(f"  {model.label}: plan compiled and verified, training step recorded: {len(names)} kernels, "
                  f"{len(orders[model.name]) - len(names)} transfers/events ({measured[f'record {model.name}']:.1f} s)")
            unit.fields.update(model=model.name, launches=len(names), arena_mib=plan.memory.arena_bytes / MIB)
            if name.startswith("step-check"):
                measured["cpu step"] = _dry_cpu_reference_step(model)
            if name.startswith("step-timing"):
                dry_run_torch([model], plans, launches)
    with Unit(out, f"breakdown {QUICK_TIMING.name}", failures, status="dry") as unit:
        step = entries[QUICK_TIMING.name]
        timed = timed_replay(step, None, EventStandIn)
        rows = summed_by_kind(timed)
        label = ("STAND-IN: no device in the dry run; the entries are the recorded step's, every time is 0 "
                 "(timed_replay with stand-in events)")
        print(format_breakdown(rows, label))
        layers = per_layer(step, timed)
        layers_label = "STAND-IN: no device in the dry run, every measured time is 0; the predictions are the model's"
        print(format_layers(layers, layers_label))
        unit.fields.update(label=label, rows=[dict(name=n, launches=c) for n, c, _, _ in rows],
                           layers_label=layers_label, layers=layers)
    out.write(f"torch.compile {QUICK_TIMING.name}", "not-run", reason="dry run (minutes of compiling on a CPU)")
    estimate = quick_estimate(measured)
    for line in estimate["lines"]:
        print(line)
    summary = {"arena_mib": plans[QUICK_TIMING.name].memory.arena_bytes / MIB, "estimate_s": estimate["total_s"]}
    return summary


def _dry_cpu_reference_step(model):
    """The CPU side of step-check runs for real in the dry run (its time goes into the estimate)."""
    from cpu_ref import CpuExecutor
    plan = compile_step_plan(model, fuse=False, amp=False)
    (x, y), = step_batches(model, 1)
    cpu = CpuExecutor(plan, optimizer=sgd(), seed=0)
    started = time.perf_counter()
    loss = cpu.train_step(x, y, 0.1)
    seconds = time.perf_counter() - started
    print(f"  fp32 CPU reference step of {model.label} (step-check's oracle): loss {loss:.4f}, {seconds:.1f} s here")
    return seconds


def quick_estimate(measured):
    """Seconds a --quick GPU run should take (a prediction, each term printed)."""
    record_s = sum(v for k, v in measured.items() if k.startswith("record"))
    terms = [("CUDA/PyTorch initialisation (assumed)", CUDA_INIT_S),
             ("preflight: 6 checks, the JIT of 2 tensor-core kernels, tiny launches, one capture (assumed)",
              PREFLIGHT_S),
             (f"device JIT of every kernel: compile_ptx here {measured['compile']:.1f} s x {NVVM_TO_DEVICE_JIT:g}",
              measured["compile"] * NVVM_TO_DEVICE_JIT),
             ("numba CPU kernels on a cold cache (assumed)", CPU_JIT_COLD_S),
             (f"fp32 CPU reference step (measured here {measured['cpu step']:.1f} s, x2 for its first run)",
              2 * measured["cpu step"]),
             (f"plans + tape recording: measured here {record_s:.1f} s, x{2 + 3} executors", 5 * record_s),
             (f"graph-vs-eager: 3 executors x {REPLAY_STEPS} steps (assumed 1 s)", 1.0),
             (f"timing: ours eager + graph ({TIMED_S:g} s each + train_step {TIMED_S / 2:g} s) + torch eager",
              3.5 * TIMED_S + TIMED_S + TORCH_WARMUP_S),
             ("breakdown: one eager step with events (assumed 2 s)", 2.0)]
    total = sum(seconds for _, seconds in terms)
    lines = ["estimate of `benchmarks.gpu.check --quick` on the GPU (a PREDICTION from this dry run, not a measurement):"]
    lines += [f"  {seconds:6.1f} s  {what}" for what, seconds in terms]
    verdict = "fits" if total <= QUICK_BUDGET_S else "DOES NOT FIT"
    lines.append(f"  {total:6.1f} s  total, {verdict} the {QUICK_BUDGET_S} s budget (torch.compile runs only if time "
                 f"is left)")
    return {"total_s": total, "lines": lines, "terms": {what: seconds for what, seconds in terms}}


def summary_line(summary):
    return paste_line(QUICK_TIMING.name, QUICK_TIMING.batch, summary.get("ours_ips"), summary.get("replay", "graph"),
                      summary.get("torch_ips"), summary.get("max_err"), summary.get("arena_mib"),
                      summary.get("torch_mib"))
