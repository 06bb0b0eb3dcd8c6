"""GPU check of the CUDA path: a one-shot protocol for a short-lived GPU (600 s per command).

    bash benchmarks/gpu/first_run.sh OUT                          # the first run (docs/gpu-runbook.md)
    python -m benchmarks.gpu.check --quick --json gpu.jsonl       # what it runs: 480 s budget, JIT included
    python -m benchmarks.gpu.check --json gpu.jsonl               # everything (sized for an H200, under 8 minutes)
    python -m benchmarks.gpu.check --dry-run --quick --json out.jsonl   # CPU only (CI): no GPU, no simulator
    python -m benchmarks.gpu.check --only conv                    # kernel rows / step sections by name
    python -m benchmarks.gpu.check --static --json k.jsonl        # tensor-core kernels: ptxas figures (no GPU)

Every run first writes the versions record (Python, numpy, numba, numba-cuda, cuda-core,
cuda-bindings, torch and its CUDA, driver, GPU name, SM count, clocks, planner build), on a GPU then
the preflight (``preflight``: each assumption only a GPU can check, alone, in seconds: PASS /
FAIL with the error), then one JSON Lines record per finished unit, flushed at once: a run cut off
by a time limit keeps everything it measured (on SIGTERM the unit running records "interrupted" and
a summary follows; a unit that raises records "crashed" with its traceback's tail and the next
runs). ``--quick`` runs each unit in its own process (quick_run.py: warm-up compile, preflight, every tile,
step-check resnet20, graph-vs-eager resnet20, resnet18-CIFAR b256 images/s against PyTorch eager AMP
channels_last and torch.compile if time is left, a per-kernel breakdown of one step); it ends with one
line to paste:

    gpu: <model> <batch> ours <img/s> (graph) torch-eager-amp <img/s> ratio <x> | max err vs cpu <e> | arena <MiB> vs torch max_memory_allocated <MiB>

The full run: every kernel row cross-checked against the numpy spec and timed, graph-versus-eager
replay of a hand-made tape, then the step sections (step-check, step-replay, step-timing: see
``step_common``), then data-parallel (``ddp``: 1 vs 2 GPUs; says so on a 1-GPU device). ``--budget`` bounds a GPU run: units that no longer fit are recorded as
not run (exit 1). ``--dry-run`` runs the same units on the CPU: every kernel launch type-checked
against the kernel table, the step sections' plans compiled and each training step recorded by
the executor's own code, the PyTorch twins checked; with ``--quick`` it also compiles every kernel
to PTX and prints the estimate of the GPU run's time (a prediction).
"""
import argparse
import sys
import time

from numba import cuda

from .kernel_cases import CHECK_BATCH, TIMING_BATCH, table
from .kernels import cross_check, graph_check, timing_table
from .preflight import preflight
from .protocol import Interrupted, RecordWriter, Unit, interrupt_on_sigterm
from .quick import QUICK_BUDGET_S, dry_run_quick, summary_line, write_versions
from .quick_run import run_quick
from .budget import Budget
from .step_common import DEFAULT_BUDGET_S, SECTION_TITLES, STEP_SECTIONS, step_selection
from .steps import step_check, step_replay
from .timing import step_timing, timing_targets
from .ddp import SECTION, data_parallel
from .dry import dry_run
from .model import print_conv_predictions
from cuda_kernels.graph import new_stream


def run_step_sections(only, budget, failures, skipped, notes, out):
    """The step-* sections ``--only`` selects, one record each."""
    selected = step_selection(only)
    for section, function in (("step-check", step_check), ("step-replay", step_replay),
                              ("step-timing", step_timing)):
        if section not in selected:
            continue
        print(f"({SECTION_TITLES[section]})")
        with Unit(out, section, failures) as unit:
            if section == "step-timing":
                rows = function(selected[section], budget, failures, skipped, notes)
                unit.fields["rows"] = {name: {k: v for k, v in row.items() if k != "model"}
                                       for name, row in rows.items()}
                for line in timing_targets(rows):
                    print(line)
            else:
                unit.fields["results"] = function(selected[section], budget, failures, skipped)


def run_kernel_sections(only, stream, failures, out):
    """Kernel rows (cross-check, timing) and graph-vs-eager replay of a hand-made tape, one record each."""
    cross_rows = {n: b for n, b in table(CHECK_BATCH).items() if only in n}
    if cross_rows:
        with Unit(out, "kernel rows", failures) as unit:
            print(f"cross-checks at batch {CHECK_BATCH}:")
            unit.fields["failures"] = cross_check(cross_rows, stream)
            failures += unit.fields["failures"]
            print(f"timings at batch {TIMING_BATCH} (eager tape replay, events on one stream):")
            unit.fields["timings"] = timing_table({n: b for n, b in table(TIMING_BATCH).items() if only in n}, stream)
    else:
        print(f"kernel rows: none match --only {only!r}")
    if not only or only in "graph-vs-eager":
        with Unit(out, "graph-vs-eager (hand-made tape)", failures) as unit:
            eager_us, graph_us, launches, graph_failures = graph_check(stream)
            failures += graph_failures
            unit.fields.update(eager_us=eager_us, graph_us=graph_us, launches=launches, failures=graph_failures)
            print(f"graph vs eager, {launches} launches per step: eager {eager_us:.1f} us, graph {graph_us:.1f} us")


def build_parser():
    """The command line (a new section adds its option here and its call in ``main``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU-side self-test; no GPU needed")
    parser.add_argument("--static", action="store_true", help="tensor-core kernels: ptxas registers, spills, "
                        "shared memory, mma per iteration, predicted TFLOP/s (no GPU; --json writes the records)")
    parser.add_argument("--quick", action="store_true", help=f"the first-run protocol ({QUICK_BUDGET_S} s budget, "
                        "compile time included): resnet20 check, graph vs eager, resnet18-cifar vs PyTorch, breakdown")
    parser.add_argument("--only", default="", help="run the kernel rows whose name contains this, and the step "
                        f"sections ({', '.join(STEP_SECTIONS)}) or their models whose name contains it")
    parser.add_argument("--json", help="write one JSON Lines record per finished unit here (versions first)")
    parser.add_argument("--budget", type=float, default=None,
                        help=f"seconds for the whole run (default {QUICK_BUDGET_S} with --quick, else "
                        f"{DEFAULT_BUDGET_S}); later units that no longer fit are recorded as not run")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.static:   # tensor-core kernels, compiled only (benchmarks/gpu/static.py)
        from .static import static_main
        return static_main(args.json)
    if args.quick and args.only:
        raise SystemExit("benchmarks.gpu.check: --quick runs a fixed list of units; drop --only (or --quick)")
    started = time.time()
    budget = Budget(args.budget or (QUICK_BUDGET_S if args.quick else DEFAULT_BUDGET_S))
    out = RecordWriter(args.json)
    failures, skipped, notes, summary = [], [], [], {}
    interrupt_on_sigterm()   # a time limit's SIGTERM: the unit running records "interrupted", then the summary
    try:
        write_versions(out, failures)
        if args.dry_run and args.quick:
            summary = dry_run_quick(out, failures)
            print_conv_predictions()   # PREDICTED conv times, mma beside SIMT
        elif args.dry_run:
            with Unit(out, "dry-run", failures, status="dry"):
                dry_run(args.only)
            print_conv_predictions()
        elif not cuda.is_available():
            print("benchmarks.gpu.check: no CUDA GPU here; use --dry-run for the CPU self-test", file=sys.stderr)
            out.write("gpu", "not-run", reason="numba.cuda.is_available() is False")
            return 2
        elif args.quick:
            print(f"--quick: budget {budget.seconds:.0f} s from the start, compile time included; each unit in "
                  f"its own process")
            summary = run_quick(out, budget, failures, skipped, notes)   # preflight and tile checks first
        else:
            print(f"budget {budget.seconds:.0f} s")
            preflight(out, failures)
            run_kernel_sections(args.only, new_stream(), failures, out)
            run_step_sections(args.only, budget, failures, skipped, notes, out)
            if not args.only or args.only in SECTION:
                data_parallel(out, failures, notes)
        print()
        for note in notes:
            print(f"note: {note}")
        for line in skipped:
            print(f"NOT RUN: {line}")
        verdict = ("FAILED: " + "; ".join(failures) if failures else
                   "INCOMPLETE (see NOT RUN)" if skipped else "dry run ok" if args.dry_run else "all checks passed")
        line = summary_line(summary)
        out.write("summary", "failed" if failures else "not-run" if skipped else "dry" if args.dry_run else "ok",
                  time.time() - started, verdict=verdict, paste=line, failures=failures, not_run=skipped,
                  notes=notes, **summary)
        print(f"{verdict} ({time.time() - started:.0f} s)")
        print(line)
        return 1 if failures or skipped else 0
    except (Interrupted, KeyboardInterrupt) as error:
        verdict = f"INTERRUPTED: {type(error).__name__}: {error}" + (f"; FAILED: {'; '.join(failures)}" if failures
                                                                     else "")
        out.write("summary", "interrupted", time.time() - started, verdict=verdict, failures=failures,
                  not_run=skipped, notes=notes, **summary)
        print(f"{verdict} ({time.time() - started:.0f} s)")
        return 1
    finally:
        out.close()


if __name__ == "__main__":
    sys.exit(main())
