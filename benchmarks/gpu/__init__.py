"""The GPU protocol of the CUDA path: a one-shot check for a short-lived GPU machine.

Run from the repository root: ``python -m benchmarks.gpu.check --help``; the whole first run is
``bash benchmarks/gpu/first_run.sh OUT_DIR`` (docs/gpu-runbook.md). Modules:

    check         the command line (versions, the --quick run or the full run, the summary)
    quick_run     --quick on a GPU, and what both runs share: warm-up, checks, units run in turn
    full_run      the full run on a GPU; units: the units as they run in their own process
    protocol      records (JSON Lines), units, the versions record, the per-kernel breakdown, the paste line
    isolate       each unit in a spawned subprocess with its own timeout (with or without --quick)
    budget        the run's time budget (an injected clock) and the --quick estimate
    preflight     GPU-only assumptions, each alone; tile_cases: every GPU tile x direction on the device
    quick         the --quick units; dry: the --dry-run; static: --static (ptxas figures)
    kernel_cases, kernels, steps, step_common, timing, layers, model, ddp: the sections and their models
"""
import os

os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")   # small grids are deliberate in places
