"""``benchmarks.gpu.check --quick``: the first run on a short-lived GPU. On a GPU its units run each in
their own process (quick_run.py, units.py); this module holds what both sides share: the models,
the versions unit, the breakdown of one step, the summary line, and the ``--dry-run --quick`` units on
the CPU (every kernel compiled to PTX, the plans compiled and the steps recorded as the executor does,
the breakdown over the recorded step with stand-in events) and the estimate of the GPU run
(estimate.py, printed; a prediction)."""
import time
from types import SimpleNamespace

from cuda_kernels.registry import SIMULATOR

from .estimate import Measured, quick_estimate

from .layers import format_layers, per_layer
from .protocol import (Unit, format_breakdown, paste_line, summed_by_kind, timed_replay, versions_line,
                            versions_record)
from .step_common import (CHECK_MODELS, MIB, REPLAY_MODELS, REPLAY_STEPS, TIMED_S,
                               TIMING_LR, TIMING_MODELS, WARMUP_STEPS, compile_step_plan, release_device_memory,
                               sgd, step_batches)

QUICK_BUDGET_S = 480        # first_run.sh gives the run 500 s of its 560: the estimate must be <= 70% of this
QUICK_CHECK, QUICK_REPLAY, QUICK_TIMING = CHECK_MODELS[0], REPLAY_MODELS[0], TIMING_MODELS[0]
assert (QUICK_CHECK.name, QUICK_REPLAY.name, QUICK_TIMING.name) == ("resnet20", "resnet20", "resnet18-cifar")
REPRESENTATIVE_MMA = "mma_conv2d_backward_weight_128x128x32"   # the slowest tensor-core kernel to compile here


def write_versions(out, failures):
    with Unit(out, "versions", failures) as unit:
        record = versions_record()
        unit.fields.update(record)
        print(versions_line(record))


# ---- the compile unit ------------------------------------------------------------------------------------

def _compile_every_kernel(dry):
    """``{kernel: seconds}``: ``spec.compile()`` on the GPU (the cold JIT every later unit would
    pay), ``compile_ptx`` for sm_90 in the dry run (NVVM only; what the estimate scales)."""
    from cuda_kernels.registry import all_kernels
    seconds = {}
    if dry:
        from numba import cuda
        import numba.cuda.dispatcher as dispatcher
        saved = dispatcher.get_current_device    # device functions target the current device: say sm_90
        dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))
        try:
            for name, spec in all_kernels().items():
                started = time.process_time()     # CPU seconds: what a loaded machine does not stretch
                cuda.compile_ptx(spec.pyfunc, spec.signature, cc=(9, 0))
                seconds[name] = time.process_time() - started
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
        what = "compile_ptx sm_90 on this CPU (NVVM only, CPU seconds)" if dry else \
            "cold JIT on the device (NVVM, ptxas, load)"
        print(f"  {len(seconds)} kernels, {what}: {total:.1f} s; slowest "
              + ", ".join(f"{k} {v:.1f} s" for k, v in slowest))
        unit.fields.update(kernels=len(seconds), total_s=total, what=what, per_kernel_s=seconds)
        return total


# ---- the GPU run: quick_run.py (each unit in its own process); the summary's timing values

def timing_summary(row):
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


def gpu_breakdown(model, CudaExecutor):
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
    from .spin import spin_before
    timed = timed_replay(entries, ex.stream, HostClockEvent if SIMULATOR else cuda.event,
                         None if SIMULATOR else spin_before(len(entries)))
    rows = summed_by_kind(timed)
    label = (f"{model.label}: STAND-IN times, a host clock around the CUDA simulator's launches, not a GPU's"
             if SIMULATOR else f"{model.label}, eager replay after a spin kernel that keeps the queue ahead of the "
             f"host, CUDA events around each entry")
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
            started = time.process_time()
            plan = plans[model.name] = compile_step_plan(model)
            plan.verify()
            names, _, orders[model.name], entries[model.name] = dry_record_train_step(plan, sgd())
            launches[model.name] = len(names)
            measured[f"record {model.name}"] = time.process_time() - started
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
    with Unit(out, "estimate", failures, status="dry") as unit:
        estimate = quick_estimate(_estimate_inputs(measured), QUICK_BUDGET_S)
        for line in estimate["lines"]:
            print(line)
        unit.fields.update(total_s=estimate["total_s"], share=estimate["share"], fits=estimate["fits"],
                           terms=estimate["terms"], budget_s=QUICK_BUDGET_S)
    return {"arena_mib": plans[QUICK_TIMING.name].memory.arena_bytes / MIB, "estimate_s": estimate["total_s"],
            "estimate_share": estimate["share"]}


def _estimate_inputs(measured):
    from cuda_kernels.mma_kernels import all_mma_kernels
    from cuda_kernels.registry import all_kernels
    from .preflight import CHECKS
    from .tile_cases import CASES
    return Measured(table_compile_ptx=measured["compile"], table_kernels=len(all_kernels()),
                    mma_compile=_representative_mma_compile(), mma_kernels=len(all_mma_kernels()),
                    child_start=_child_start(), cpu_step=measured["cpu step"],
                    record={m.name: measured[f"record {m.name}"] for m in (QUICK_CHECK, QUICK_TIMING)},
                    checks=len(CHECKS) + len(CASES), timed_s=TIMED_S, replay_steps=REPLAY_STEPS)


def _child_start():
    """Seconds a unit's process takes to start and import what the units import (measured here)."""
    import subprocess
    import sys
    from .isolate import REPO
    before = _children_cpu()
    subprocess.run([sys.executable, "-c", "import benchmarks.gpu.units, benchmarks.gpu.tile_cases, cpu_ref, "
                    "cuda_kernels"], cwd=REPO, check=True, timeout=300)
    seconds = _children_cpu() - before
    print(f"  a unit's process: start-up and imports {seconds:.1f} CPU s here")
    return seconds


def _children_cpu():
    """CPU seconds (user + system) of this process's finished children: what a loaded machine does not stretch."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _representative_mma_compile():
    """compile_ptx for sm_90 plus ptxas (where installed) of ``REPRESENTATIVE_MMA``, measured here."""
    import shutil
    import subprocess
    import tempfile
    from numba import cuda
    import numba.cuda.dispatcher as dispatcher
    from cuda_kernels.mma_kernels import all_mma_kernels
    spec = all_mma_kernels()[REPRESENTATIVE_MMA]
    saved = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=(9, 0))
    try:
        started = time.process_time()
        ptx, _ = cuda.compile_ptx(spec.pyfunc, spec.signature, cc=(9, 0))
        nvvm = time.process_time() - started
    finally:
        dispatcher.get_current_device = saved
    ptxas_s, how = 0.0, "ptxas not installed here: NVVM only"
    if shutil.which("ptxas"):
        with tempfile.TemporaryDirectory() as folder:
            path = f"{folder}/k.ptx"
            with open(path, "w") as f:
                f.write(ptx)
            started = _children_cpu()
            subprocess.run(["ptxas", "-arch=sm_90", path, "-o", f"{folder}/k.cubin"], check=True, timeout=300)
            ptxas_s, how = _children_cpu() - started, "ptxas"
    print(f"  {REPRESENTATIVE_MMA}: compile_ptx {nvvm:.1f} + {how} {ptxas_s:.1f} CPU s here")
    return nvvm + ptxas_s


def _dry_cpu_reference_step(model):
    """The CPU side of step-check runs for real in the dry run (its time goes into the estimate)."""
    from cpu_ref import CpuExecutor
    plan = compile_step_plan(model, fuse=False, amp=False)
    (x, y), = step_batches(model, 1)
    cpu = CpuExecutor(plan, optimizer=sgd(), seed=0)
    started = time.process_time()
    loss = cpu.train_step(x, y, 0.1)
    seconds = time.process_time() - started
    print(f"  fp32 CPU reference step of {model.label} (step-check's oracle): loss {loss:.4f}, {seconds:.1f} CPU s here")
    return seconds


def summary_line(summary):
    return paste_line(QUICK_TIMING.name, QUICK_TIMING.batch, summary.get("ours_ips"), summary.get("replay", "graph"),
                      summary.get("torch_ips"), summary.get("max_err"), summary.get("arena_mib"),
                      summary.get("torch_mib"))
