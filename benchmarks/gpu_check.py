"""GPU check of the CUDA path, on a real device (sized for an H200, under 8 minutes):

- kernel rows: every kernel cross-checked against the numpy spec, a kernel timing table, and
  graph-versus-eager replay of a hand-made tape;
- step-check: a whole training step at real shapes, ``CudaExecutor`` (fused AMP plan) against
  ``CpuExecutor`` (fp32) from the same weights: loss, gradients, updates, BN statistics;
- step-replay: CUDA graph replay equals eager tape replay over several steps (one graph launch
  per step);
- step-timing: images/s of one training step of resnet18-cifar, resnet50 and mobilenet_v2, ours
  (eager tape, graph replay) against PyTorch eager AMP channels_last and torch.compile, side by
  side, with our arena bytes against PyTorch's ``max_memory_allocated``.

    python benchmarks/gpu_check.py --dry-run    # CPU only (CI): no GPU, no simulator
    python benchmarks/gpu_check.py              # on the GPU; exit 0 only if every check ran and passed
    python benchmarks/gpu_check.py --only conv --json out.json
    python benchmarks/gpu_check.py --only step-timing --budget 300

``--dry-run`` builds every kernel row with numpy stand-ins for the device arrays and runs every
launcher against the kernel table's signatures (so argument lists, shapes and kernel names are
all checked); it compiles the plans of the step sections, records each training step with the
executor's own code against the kernel table, checks the PyTorch twins of the timed models
(parameter counts, names, shapes; their timed step run once on the CPU at a tiny size), prints
the plan and exits 0. ``--budget`` bounds the GPU run: units that no longer fit are reported as
NOT RUN (exit 1), torch.compile is tried last and only with time left.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")   # small grids are deliberate in places
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from benchmarks._gpu_kernel_cases import CHECK_BATCH, TIMING_BATCH, table  # noqa: E402
from benchmarks._gpu_kernels import cross_check, graph_check, timing_table  # noqa: E402
from benchmarks._gpu_step_common import (DEFAULT_BUDGET_S, SECTION_TITLES, STEP_SECTIONS, Budget,  # noqa: E402
                                         StepModel, report_crash, step_selection)
from benchmarks._gpu_steps import step_check, step_replay  # noqa: E402
from benchmarks._gpu_timing import step_timing, timing_targets  # noqa: E402
from benchmarks._gpu_dry import dry_run  # noqa: E402
from cuda_kernels._graph import new_stream  # noqa: E402


def run_step_sections(only, budget, failures, skipped, notes):
    """The step-* sections ``--only`` selects; returns their results for ``--json``."""
    selected, out = step_selection(only), {}
    for section, function in (("step-check", step_check), ("step-replay", step_replay),
                              ("step-timing", step_timing)):
        if section not in selected:
            continue
        print(f"\n== {section}: {SECTION_TITLES[section]} ==")
        started = time.time()
        try:
            if section == "step-timing":
                rows = function(selected[section], budget, failures, skipped, notes)
                out[section] = {name: {k: v for k, v in row.items() if k != "model"} for name, row in rows.items()}
                for line in timing_targets(rows):
                    print(line)
            else:
                out[section] = function(selected[section], budget, failures, skipped)
        except Exception as error:
            report_crash(section, error, failures)
        print(f"== {section} done in {time.time() - started:.0f} s ==")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU-side self-test; no GPU needed")
    parser.add_argument("--static", action="store_true", help="tensor-core kernels: ptxas registers, spills, "
                        "shared memory, mma per iteration, predicted TFLOP/s (no GPU; --json writes the records)")
    parser.add_argument("--only", default="", help="run the kernel rows whose name contains this, and the step "
                        f"sections ({', '.join(STEP_SECTIONS)}) or their models whose name contains it")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                        help="seconds for the whole run; later units that no longer fit are reported as not run")
    args = parser.parse_args(argv)
    if args.static:   # tensor-core kernels (benchmarks/_gpu_static.py)
        from benchmarks._gpu_static import static_main
        return static_main(args.json)
    if args.dry_run:
        dry_run(args.only)
        from benchmarks._gpu_model import print_conv_predictions
        print_conv_predictions()   # PREDICTED conv times, mma vs SIMT (benchmarks/_gpu_model.py)
        return 0
    if not cuda.is_available():
        print("gpu_check: no CUDA GPU here; use --dry-run for the CPU self-test", file=sys.stderr)
        return 2
    stream, started = new_stream(), time.time()
    budget = Budget(args.budget, started)
    print(f"device: {cuda.get_current_device().name}; budget {args.budget:.0f} s")
    failures, skipped, notes = [], [], []
    report, graph = [], {}
    cross_rows = {n: b for n, b in table(CHECK_BATCH).items() if args.only in n}
    if cross_rows:
        try:
            print(f"cross-checks at batch {CHECK_BATCH}:")
            failures += cross_check(cross_rows, stream)
            print(f"timings at batch {TIMING_BATCH} (eager tape replay, events on one stream):")
            report = timing_table({n: b for n, b in table(TIMING_BATCH).items() if args.only in n}, stream)
        except Exception as error:   # the step sections still run
            report_crash("kernel rows", error, failures)
        print(f"kernel sections done at {time.time() - started:.0f} s")
    else:
        print(f"kernel rows: none match --only {args.only!r}")
    if not args.only or args.only in "graph-vs-eager":
        try:
            eager_us, graph_us, launches, graph_failures = graph_check(stream)
            failures += graph_failures
            graph = dict(eager_us=eager_us, graph_us=graph_us, launches=launches)
            print(f"graph vs eager, {launches} launches per step: eager {eager_us:.1f} us, graph {graph_us:.1f} us")
        except Exception as error:
            report_crash("graph-vs-eager (hand-made tape)", error, failures)
    else:
        print(f"graph-vs-eager (hand-made tape): not selected by --only {args.only!r}")
    steps = run_step_sections(args.only, budget, failures, skipped, notes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(timings=report, graph=graph, steps=steps, failures=failures, not_run=skipped, notes=notes),
                      f, indent=1, default=_json_default)
    print()
    for note in notes:
        print(f"note: {note}")
    for line in skipped:
        print(f"NOT RUN: {line}")
    verdict = "FAILED: " + "; ".join(failures) if failures else ("INCOMPLETE (see NOT RUN)" if skipped else
                                                                   "all checks passed")
    print(f"{verdict} ({time.time() - started:.0f} s)")
    return 1 if failures or skipped else 0


def _json_default(value):
    if isinstance(value, (np.generic,)):
        return value.item()
    if isinstance(value, StepModel):
        return value.name
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
