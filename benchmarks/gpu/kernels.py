"""The kernel sections of the GPU check on the device: every row cross-checked against the numpy
spec, the kernel timing table, and graph-versus-eager replay of a hand-made tape."""
import numpy as np
from numba import cuda

from cuda_kernels import elementwise, optim
from cuda_kernels.graph import StepRunner, synchronize
from cuda_kernels.tape import LaunchTape
from planner.ops import Prim

from .kernel_cases import DeviceMemory

TOLERANCES = {"fp16": (2e-3, 2e-3), "fp32": (1e-4, 1e-5), "stats": (1e-3, 1e-4), "exact": (0.0, 0.0)}


def measure_tape(tape, stream, repeats=None, budget_s=0.2):
    """Mean seconds per eager replay of ``tape`` on ``stream`` (after one warm-up replay)."""
    return _time(lambda: tape.replay(stream), stream, repeats, budget_s)


def measure_runner(runner, stream, repeats=None, budget_s=0.2):
    """Mean seconds per ``runner.run(stream)`` (the first run, which may capture, is not timed)."""
    return _time(lambda: runner.run(stream), stream, repeats, budget_s)


def _time(step, stream, repeats, budget_s):
    step()
    synchronize(stream)
    start, end = cuda.event(), cuda.event()
    if repeats is None:
        start.record(stream)
        step()
        end.record(stream)
        end.synchronize()
        repeats = int(min(200, max(3, budget_s / max(start.elapsed_time(end) / 1e3, 1e-6))))
    start.record(stream)
    for _ in range(repeats):
        step()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def compare(case):
    """``[(label, max_abs_error, ok)]`` of a case's outputs against the spec."""
    results = []
    for label, (expected, tol) in case.expected().items():
        got = case.outputs[label].copy_to_host()
        if tol == "exact":
            ok, err = bool(np.array_equal(got, expected)), float(np.abs(got.astype(np.float64) - expected).max())
        else:
            rtol, atol_frac = TOLERANCES[tol]
            atol = atol_frac * float(np.abs(expected).max(initial=0.0))
            diff = np.abs(got.astype(np.float64) - expected)
            ok, err = bool(np.all(diff <= atol + rtol * np.abs(expected))), float(diff.max())
        results.append((label, err, ok))
    return results


def cross_check(rows, stream):
    failures = []
    for name, build in rows.items():
        case = build(DeviceMemory(), np.random.default_rng(0))
        cuda.synchronize()   # inputs were copied on the default stream; ``stream`` does not wait for it
        tape = LaunchTape()
        case.record(tape)
        tape.replay(stream)
        synchronize(stream)
        results = compare(case)
        failures += [f"{name}: {label}" for label, _, ok in results if not ok]
        print(f"  {name:28s} " + "  ".join(f"{label} {err:.2e} {'ok' if ok else 'FAIL'}" for label, err, ok in results))
    return failures


def timing_table(rows, stream):
    report = []
    print(f"  {'row':28s} {'us':>10s} {'TFLOP/s':>8s} {'GB/s':>8s} launches")
    for name, build in rows.items():
        case = build(DeviceMemory(), np.random.default_rng(0))
        cuda.synchronize()
        tape = LaunchTape()
        case.record(tape)
        seconds = measure_tape(tape, stream)
        tflops, gbs = case.flops / seconds / 1e12, case.bytes / seconds / 1e9
        print(f"  {name:28s} {seconds * 1e6:10.1f} {tflops:8.2f} {gbs:8.1f} {len(tape)}")
        report.append(dict(row=name, us=seconds * 1e6, tflops=tflops, gbs=gbs, launches=len(tape)))
        del case, tape
    for line in compare_families(report):
        print(line)
    return report


FAMILIES = (" simt", " mma")


def compare_families(report):
    """Pair each " mma" row of a timing report with its " simt" twin (same shapes): adds
    ``simt_us`` and ``speedup`` (simt time / mma time) to the mma row; returns the lines to print."""
    by_name = {row["row"]: row for row in report}
    lines = []
    for row in report:
        if not row["row"].endswith(FAMILIES[1]):
            continue
        base = row["row"][:-len(FAMILIES[1])]
        simt = by_name.get(base + FAMILIES[0])
        if simt is None:
            continue
        row.update(simt_us=simt["us"], speedup=simt["us"] / row["us"] if row["us"] else float("inf"))
        if not lines:
            lines.append(f"  {'same shapes, kernels=':28s} {'simt us':>10s} {'mma us':>10s} {'simt/mma':>8s}")
        lines.append(f"  {base:28s} {simt['us']:10.1f} {row['us']:10.1f} {row['speedup']:8.2f}")
    return lines


def graph_case(mem):
    """Many small launches driven by device scalars: what graph replay is for."""
    rng = np.random.default_rng(1)
    (_, x), y = mem.random(rng, 4096, np.float16), mem.output(4096, np.float16)
    (_, p), (_, g) = mem.random(rng, 4096, np.float32), mem.random(rng, 4096, np.float32)
    m, v, mask = mem.constant(np.zeros(4096, np.float32)), mem.constant(np.zeros(4096, np.float32)), mem.output(
        4096, np.uint8)
    lr, step, iteration, scale, flag, tracker = (mem.constant(np.array([a], t)) for a, t in [
        (1e-3, np.float32), (0, np.int32), (0, np.int32), (1.0, np.float32), (0, np.int32), (0, np.int32)])

    def record(t):
        for _ in range(50):
            elementwise.dropout_forward(t, x, y, mask, 0.5, 5, iteration)
            elementwise.activation_forward(t, Prim.SILU, y, y)
        optim.check_overflow(t, g, flag)
        optim.adam_step(t, p, g, m, v, lr, step, scale, flag, 0.9, 0.999, 1e-8, 0.0, True)
        optim.update_loss_scale(t, flag, scale, tracker)
        optim.advance_counters(t, flag, step, iteration)
    return record, {"y": y, "p": p, "mask": mask, "step": step, "iteration": iteration}


def graph_check(stream):
    """Graph replay equals eager replay step by step; returns (eager_us, graph_us, failures)."""
    record_e, eager = graph_case(DeviceMemory())
    record_g, graphed = graph_case(DeviceMemory())
    tape_e, tape_g = LaunchTape(), LaunchTape()
    record_e(tape_e)
    record_g(tape_g)
    cuda.synchronize()
    runner = StepRunner(tape_g, "graph")
    failures = []
    for i in range(3):
        tape_e.replay(stream)
        runner.run(stream)
        synchronize(stream)
        for label in eager:
            if not np.array_equal(eager[label].copy_to_host(), graphed[label].copy_to_host()):
                failures.append(f"graph replay {i}: {label} differs from eager")
    if graphed["step"].copy_to_host()[0] != 3:
        failures.append("graph replay did not advance the device step counter")
    if runner.graph is None:
        failures.append(f"graph-vs-eager: no graph was captured; replay in use: {runner.mode} ({runner.reason})")
    return measure_tape(tape_e, stream) * 1e6, measure_runner(runner, stream) * 1e6, len(tape_g), failures
