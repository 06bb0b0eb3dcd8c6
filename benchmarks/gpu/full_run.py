"""The full run on a GPU (``benchmarks.gpu.check`` without ``--quick``): the same isolation as ``--quick``
(quick_run.py), over every section. In this order, inside the budget:

    warm-up, preflight, tiles   as in --quick (``quick_run.prepare``): every kernel JIT-compiled once into the
                                disk cache, each preflight check and tile case in its own process
    kernel rows                 one process per row of ``kernel_cases.table``: cross-checked at CHECK_BATCH,
                                then timed at TIMING_BATCH (rows share no setup: each builds its own case)
    graph-vs-eager              the hand-made tape, one process
    step-check, step-replay, step-timing    one process per model of each section (``step_common``)
    torch.compile               one process per timed model, last (it only adds a column, and may take minutes)
    data-parallel               one process per torchrun run (``ddp``), with 2 GPUs or more

``--only`` selects kernel rows, sections and models by name, as it always did; the warm-up, the preflight
and the tiles always run. A unit whose process dies (a sticky CUDA error, a signal) or runs past its
timeout is recorded with why, and the next unit starts in a fresh process with a fresh context."""
from . import ddp, quick
from .isolate import UnitCall, run_isolated
from .kernel_cases import CHECK_BATCH, table
from .kernels import compare_families
from .quick_run import (UNITS, Turn, bounded, prepare, run_in_turn, summary_of, write_timing,
                        write_torch_compile)
from .step_common import COMPILE_RESERVE_S, SECTION_RESERVE_S, SECTION_TITLES, step_selection
from .timing import format_timing_table, timing_targets

KERNEL_ROW_NEED_S, KERNEL_ROW_TIMEOUT_S = 5.0, 90.0
GRAPH_NEED_S, GRAPH_TIMEOUT_S = 5.0, 60.0
STEP_TIMEOUT_S = {"step-check": 240.0, "step-replay": 180.0, "step-timing": 300.0}
TORCH_COMPILE_TIMEOUT_S = 400.0
SECTION_UNITS = {"step-check": "step_check", "step-replay": "graph_vs_eager", "step-timing": "step_timing"}
GRAPH_SECTION = "graph-vs-eager (hand-made tape)"


def turn(name, need_s, function, kwargs, timeout_s, **fields):
    """A ``Turn`` whose unit is ``units.function(**kwargs, **its budget's)``: ``kwargs`` a dict, or a function of
    the seconds the unit may take (the time-boxed units: step-timing, torch.compile)."""
    def call(left):
        seconds = bounded(timeout_s, left)
        return UnitCall(name, UNITS, function, kwargs(seconds) if callable(kwargs) else kwargs, seconds)
    return Turn(name, need_s, call, **fields)


def kernel_turns(only):
    return [turn(f"kernel {name}", KERNEL_ROW_NEED_S, "kernel_row", {"name": name}, KERNEL_ROW_TIMEOUT_S)
            for name in table(CHECK_BATCH) if only in name]


def step_turns(selected):
    """One turn per model of each selected step section (required models before optional ones)."""
    turns = []
    for section, models in selected.items():
        for model in sorted(models, key=lambda m: m.optional):
            name, need = f"{section} {model.name}", SECTION_RESERVE_S
            if section != "step-timing":
                turns.append(turn(name, need, SECTION_UNITS[section], {"model": model.name}, STEP_TIMEOUT_S[section]))
                continue
            turns.append(turn(name, COMPILE_RESERVE_S if model.optional else 2 * need, "step_timing",
                              lambda s, m=model.name: {"seconds_left": s, "compile_torch": False, "model": m},
                              STEP_TIMEOUT_S[section], record=write_timing, optional=model.optional))
    return turns


def compile_turns(models):
    def record(out, outcome, **extra):
        if outcome.status == "ok":   # it ran: "ok" with its timing, or "not-run" with why (a note)
            write_torch_compile(out, outcome.name, outcome.result, outcome.seconds)
        else:
            out.write(outcome.name, outcome.status, outcome.seconds, error=outcome.error, **extra)
    return [turn(f"torch.compile {m.name}", COMPILE_RESERVE_S, "torch_compile",
                 lambda s, m=m.name: {"seconds_left": s, "model": m}, TORCH_COMPILE_TIMEOUT_S, record=record,
                 optional=True) for m in models]


def run_full(out, only, budget, failures, skipped, notes, runner=run_isolated, env=None, warmup_names=None,
             tile_names=None, check_names=None):
    """Every section of the full run, each unit in its own process by ``runner``; the summary (paste line)
    fields. ``warmup_names`` / ``tile_names`` / ``check_names`` as in ``quick_run.run_quick``."""
    env, excluded = prepare(out, failures, runner, env, warmup_names, tile_names, check_names)

    def run(title, turns):
        if turns:
            print(f"\n({title})")
        return run_in_turn(out, turns, budget, failures, skipped, notes, runner, env, excluded_tiles=excluded)
    rows = run("kernel rows: cross-checked, then timed; each in its own process", kernel_turns(only))
    for line in compare_families([o.result["timing"] for o in rows.values() if "timing" in o.result]):
        print(line)
    if not only or only in GRAPH_SECTION:
        run("graph vs eager replay of a hand-made tape", [turn(GRAPH_SECTION, GRAPH_NEED_S, "hand_made_graph", {},
                                                               GRAPH_TIMEOUT_S)])
    selected, steps = step_selection(only), {}
    for section, models in selected.items():
        steps.update(run(SECTION_TITLES[section], step_turns({section: models})))
    timed = [m for m in selected.get("step-timing", ()) if f"step-timing {m.name}" in steps]
    compiled = run("torch.compile of the timed models, with the time left", compile_turns(timed))
    if timed:
        table_rows = {m.name: dict(steps[f"step-timing {m.name}"].result.get("row", {}), model=m) for m in timed}
        for m in timed:
            if f"torch.compile {m.name}" in compiled:
                table_rows[m.name]["torch.compile"] = compiled[f"torch.compile {m.name}"].result
        print(format_timing_table(table_rows))
        for line in timing_targets(table_rows):
            print(line)
    if not only or only in ddp.SECTION:
        ddp.data_parallel(out, budget, failures, skipped, notes, runner, env)
    return summary_of(steps, f"step-check {quick.QUICK_CHECK.name}", f"step-timing {quick.QUICK_TIMING.name}")
