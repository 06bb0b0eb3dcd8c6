"""GPU check of the CUDA path: a one-shot protocol for a short-lived GPU (600 s per command).

    bash benchmarks/gpu/first_run.sh OUT                          # the first run (docs/gpu-runbook.md)
    python -m benchmarks.gpu.check --quick --json gpu.jsonl       # what it runs: 480 s budget, JIT included
    python -m benchmarks.gpu.check --json gpu.jsonl               # everything, each unit in its own process
    python -m benchmarks.gpu.check --dry-run --quick --json out.jsonl   # CPU only (CI): no GPU, no simulator
    python -m benchmarks.gpu.check --only conv                    # kernel rows / step sections by name
    python -m benchmarks.gpu.check --static --json k.jsonl        # tensor-core kernels: ptxas figures (no GPU)

Every run first writes the versions record (Python, numpy, numba, numba-cuda, cuda-core,
cuda-bindings, torch and its CUDA, driver, GPU name, SM count, clocks, planner build), on a GPU then
the warm-up compile, the preflight (``preflight``: each assumption only a GPU can check, alone, in
seconds) and every tile case, then one JSON Lines record per finished unit, flushed at once: a run cut
off by a time limit keeps everything it measured (on SIGTERM the unit running records "interrupted" and
a summary follows). On a GPU every unit runs in a spawned process of its own with its own timeout
(``isolate``), with or without ``--quick``: a unit that raises, dies (a sticky CUDA error, a signal) or
times out is recorded "crashed" / "timeout" with why, and the next unit runs in a fresh process with a
fresh CUDA context. ``--quick`` (quick_run.py: warm-up compile, preflight, every tile, step-check resnet20, graph-vs-eager resnet20, resnet18-CIFAR b256 images/s against PyTorch eager AMP
channels_last and torch.compile if time is left, a per-kernel breakdown of one step); it ends with one
line to paste:

    gpu: <model> <batch> ours <img/s> (graph) torch-eager-amp <img/s> ratio <x> | max err vs cpu <e> | arena <MiB> vs torch max_memory_allocated <MiB>

The full run (full_run.py; a process per unit): warm-up, preflight and tiles as in ``--quick``, every
kernel row cross-checked against the numpy spec and timed, graph-versus-eager replay of a hand-made
tape, the step sections per model (step-check, step-replay, step-timing: see ``step_common``),
torch.compile per timed model, then data-parallel (``ddp``: 1 vs 2 GPUs, each torchrun run a unit;
says so on a 1-GPU device). ``--budget`` bounds a GPU run: units that no longer fit are recorded as
not run (exit 1). ``--dry-run`` runs the same units on the CPU: every kernel launch type-checked
against the kernel table, the step sections' plans compiled and each training step recorded by
the executor's own code, the PyTorch twins checked; with ``--quick`` it also compiles every kernel
to PTX and prints the estimate of the GPU run's time (a prediction).
"""
import argparse
import sys
import time

from numba import cuda

from .protocol import Interrupted, RecordWriter, Unit, interrupt_on_sigterm
from .quick import QUICK_BUDGET_S, dry_run_quick, summary_line, write_versions
from .full_run import run_full
from .quick_run import run_quick
from .budget import Budget
from .step_common import DEFAULT_BUDGET_S, STEP_SECTIONS
from .dry import dry_run
from .model import print_conv_predictions


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
                        f"{DEFAULT_BUDGET_S}); later units that no longer fit are recorded as not run "
                        "(every unit runs in its own process, with or without --quick)")
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
            print(f"budget {budget.seconds:.0f} s from the start, compile time included; each unit in its own "
                  f"process")
            summary = run_full(out, args.only, budget, failures, skipped, notes)   # preflight and tile checks first
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
