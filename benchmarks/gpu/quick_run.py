"""``--quick`` on a GPU: every unit that launches kernels runs in its own spawned process (``isolate``), in
this order, inside the budget:

    warm-up     every kernel JIT-compiled once, in parallel processes, into numba-cuda's disk cache
                (``BLUEPRINT_CUDA_CACHE=1``); every later process only loads them (``=read``)
    preflight   each GPU-only assumption (preflight.CHECKS) in its own process, side by side
    tiles       every GPU tile x {forward, dgrad, wgrad} (tile_cases) in its own process, side by side;
                a failed or crashed case excludes its tile from the units below (they run it SIMT)
    step-check resnet20 -> graph-vs-eager resnet20 -> step-timing resnet18-cifar (+ torch.compile with
    the time left) -> breakdown resnet18-cifar: one process each, one after another

A unit whose process dies (a sticky CUDA error, a signal) or runs past its timeout is recorded with why;
the next unit starts in a fresh process with a fresh context. The full run (full_run.py) uses the same
pieces: ``prepare`` (warm-up, preflight, tiles) and ``run_in_turn`` (units one after another in the budget)."""
import os
import tempfile
from dataclasses import dataclass
from typing import Callable

from . import quick
from .isolate import UnitCall, run_isolated, run_many
from .tile_cases import CASES, excluded_tiles

UNITS = "benchmarks.gpu.units"
PARALLEL = max(1, min(12, (os.cpu_count() or 2) - 2))   # side-by-side processes (JIT is CPU-bound)
COMPILE_TIMEOUT_S, CHECK_TIMEOUT_S = 240.0, 90.0
STEP_TIMEOUT_S = {"step-check": 120.0, "graph-vs-eager": 90.0, "step-timing": 200.0, "breakdown": 60.0}
STEP_NEED_S = {"step-check": 25.0, "graph-vs-eager": 15.0, "step-timing": 40.0, "breakdown": 10.0}
TORCH_COMPILE_NEED_S = 100.0     # timing.COMPILE_RESERVE_S: torch.compile is tried only with this much left
BREAKDOWN_RESERVE_S = 30.0       # kept from the timing unit (torch.compile may use all it gets) for the breakdown


def warmup_groups(names, workers):
    """``names`` dealt round-robin, tensor-core kernels first (the slow ones spread over every worker)."""
    ordered = sorted(names, key=lambda n: (not n.startswith("mma_"), n))
    return [g for g in (ordered[i::workers] for i in range(workers)) if g]


def all_kernel_names():
    from cuda_kernels.mma_kernels import all_mma_kernels
    from cuda_kernels.registry import all_kernels
    return sorted({**all_kernels(), **all_mma_kernels()})


def cache_env(base=None):
    """The environment of the units: a disk cache folder (``NUMBA_CACHE_DIR``, first_run.sh's or a new one)."""
    env = dict(os.environ if base is None else base)
    env.setdefault("NUMBA_CACHE_DIR", tempfile.mkdtemp(prefix="blueprint-numba-cache-"))
    return env


def _merge(outcome, failures, skipped, notes):
    for key, lines in (("failures", failures), ("skipped", skipped), ("notes", notes)):
        lines.extend(outcome.result.get(key, []))
    if outcome.status in ("crashed", "timeout"):
        failures.append(f"{outcome.name}: {outcome.status}: {outcome.error.splitlines()[0] if outcome.error else ''}")
    elif outcome.status == "failed" and not outcome.result.get("failures"):
        failures.append(f"{outcome.name}: {outcome.error}")


def _fields(fields):
    """A unit's result as record fields: the record's own keys (unit, status, seconds) renamed result_*."""
    return {(f"result_{k}" if k in ("unit", "status", "seconds") else k): v for k, v in fields.items()
            if k not in ("failures", "skipped", "notes")}


def _write(out, outcome, **extra):
    return out.write(outcome.name, outcome.status, outcome.seconds, **_fields(outcome.record()), **extra)


def run_warmup(out, failures, runner, env, names=None):
    groups = warmup_groups(names or all_kernel_names(), PARALLEL)
    calls = [UnitCall(f"compile {i + 1}/{len(groups)}", UNITS, "compile_kernels", {"names": g}, COMPILE_TIMEOUT_S)
             for i, g in enumerate(groups)]
    outcomes = run_many(calls, runner, PARALLEL, dict(env, BLUEPRINT_CUDA_CACHE="1"))
    seconds = {k: v for o in outcomes for k, v in o.result.get("seconds", {}).items()}
    for o in outcomes:
        if o.status != "ok":
            failures.append(f"{o.name}: {o.status}: {o.error}")
    out.write("compile", "ok" if all(o.status == "ok" for o in outcomes) else "failed",
              max((o.seconds for o in outcomes), default=0.0), kernels=len(seconds), workers=len(calls),
              jit_total_s=round(sum(seconds.values()), 1), per_kernel_s=seconds,
              workers_status={o.name: o.status + (f": {o.error}" if o.error else "") for o in outcomes})
    print(f"  {len(seconds)} kernels JIT-compiled in {len(calls)} processes side by side "
          f"({sum(seconds.values()):.0f} s of JIT in all)")


def run_checks(out, failures, runner, env, tile_names=None, check_names=None):
    """The preflight checks and the tile cases, each in its own process; returns ``BLUEPRINT_MMA_EXCLUDE``."""
    from .preflight import CHECKS
    checks = [UnitCall(f"preflight {c.name}", UNITS, "preflight_check", {"name": c.name}, CHECK_TIMEOUT_S)
              for c in CHECKS if check_names is None or c.name in check_names]
    tiles = [UnitCall(f"tile {name}", "benchmarks.gpu.tile_cases", "run_case", {"name": name, "seed": i},
                      CHECK_TIMEOUT_S) for i, name in enumerate(CASES if tile_names is None else tile_names)]
    outcomes = run_many(checks + tiles, runner, PARALLEL, dict(env, BLUEPRINT_CUDA_CACHE="read"))
    for outcome in outcomes[:len(checks)]:
        if outcome.status != "ok":
            failures.append(f"{outcome.name}: {outcome.status}: {outcome.error}")
        print(f"  {outcome.status.upper()} {outcome.name} ({outcome.seconds:.1f} s) "
              f"{outcome.result.get('detail') or outcome.error}")
    out.write("preflight", "ok" if all(o.status == "ok" for o in outcomes[:len(checks)]) else "failed",
              max((o.seconds for o in outcomes[:len(checks)]), default=0.0),
              checks=[dict(o.record(), name=o.name, status=o.status, seconds=round(o.seconds, 2))
                      for o in outcomes[:len(checks)]])
    statuses = {}
    for call, outcome in zip(tiles, outcomes[len(checks):]):
        statuses[call.kwargs["name"]] = outcome.status
        print(f"  {outcome.status.upper()} {outcome.name} ({outcome.seconds:.1f} s) "
              f"{outcome.error or 'max |error| %.2e' % outcome.result.get('max_error', float('nan'))}")
    excluded = excluded_tiles(statuses)
    for name, status in statuses.items():
        if status != "ok":
            failures.append(f"tile {name}: {status}; excluded from the timed units (runs SIMT there)")
    out.write("tiles", "ok" if not excluded else "failed", max((o.seconds for o in outcomes[len(checks):]),
                                                               default=0.0),
              cases={call.kwargs["name"]: dict(o.record(), status=o.status, seconds=round(o.seconds, 2))
                     for call, o in zip(tiles, outcomes[len(checks):])},
              excluded_tiles=excluded, fallback="SIMT for the excluded tiles in every unit below" if excluded else "")
    return excluded


def prepare(out, failures, runner, env, warmup_names=None, tile_names=None, check_names=None):
    """The warm-up, the preflight checks and the tile cases (``run_warmup``, ``run_checks``); the environment of
    every later unit (the kernel cache only read, the failed tiles excluded) and the excluded tiles."""
    env = cache_env(env)
    run_warmup(out, failures, runner, env, warmup_names)
    excluded = run_checks(out, failures, runner, env, tile_names, check_names)
    return dict(env, BLUEPRINT_CUDA_CACHE="read", BLUEPRINT_MMA_EXCLUDE=excluded), excluded


@dataclass(frozen=True)
class Turn:
    """A unit run in its turn: ``call(seconds left)`` is its ``UnitCall``; it starts only with ``need_s`` of
    the budget left (else it is recorded not run: a NOT RUN line, or a note if ``optional``);
    ``record(out, outcome, **extra)`` writes its records (default: one, of what the unit returned)."""
    name: str
    need_s: float
    call: Callable
    record: Callable = None
    optional: bool = False


def run_in_turn(out, turns, budget, failures, skipped, notes, runner, env, **extra):
    """Each turn's unit in its own process (``runner``), one after another, while the budget allows; a unit
    that crashes or times out is recorded with why and the next one runs. ``extra``: fields of every record.
    Returns ``{name: UnitOutcome}`` of the units that ran."""
    outcomes = {}
    for turn in turns:
        refused = notes if turn.optional else skipped
        if not budget.allows(turn.need_s, turn.name, refused):
            out.write(turn.name, "not-run", reason=refused[-1])
            continue
        outcome = outcomes[turn.name] = runner(turn.call(budget.left()), env)
        _merge(outcome, failures, skipped, notes)
        (turn.record or _write)(out, outcome, **extra)
    return outcomes


def write_timing(out, outcome, **extra):
    """A step-timing unit's record: its row's columns as fields (torch.compile's has a record of its own)."""
    row = outcome.result.get("row", {})
    out.write(outcome.name, outcome.status, outcome.seconds, error=outcome.error, **extra,
              **_fields({k: v for k, v in row.items() if k != "torch.compile"}))


def write_torch_compile(out, name, compiled, seconds=0.0):
    out.write(name, "ok" if "seconds" in compiled else "not-run", seconds, **_fields(compiled))


def _write_quick_timing(out, outcome, **extra):
    write_timing(out, outcome, **extra)
    compiled = outcome.result.get("row", {}).get("torch.compile", {"error": "not tried: too little of the budget "
                                                                            "left"})
    write_torch_compile(out, f"torch.compile {quick.QUICK_TIMING.name}", compiled)


def bounded(timeout_s, left):
    """A unit's timeout: its own, cut to the budget left (at least a second)."""
    return min(timeout_s, max(left, 1.0))


def quick_turns():
    """step-check, graph-vs-eager, step-timing (+ torch.compile with the time left), breakdown; the --quick
    models are read here (tests replace them)."""
    def turn(key, model, function, record=None):
        name = f"{key} {model.name}"

        def call(left):
            if key != "step-timing":
                return UnitCall(name, UNITS, function, {}, bounded(STEP_TIMEOUT_S[key], left))
            timeout = max(1.0, left - BREAKDOWN_RESERVE_S)
            return UnitCall(name, UNITS, function, {"seconds_left": timeout, "compile_torch": timeout >=
                                                    TORCH_COMPILE_NEED_S + STEP_NEED_S[key]}, timeout)
        return Turn(name, STEP_NEED_S[key], call, record)
    return [turn("step-check", quick.QUICK_CHECK, "step_check"),
            turn("graph-vs-eager", quick.QUICK_REPLAY, "graph_vs_eager"),
            turn("step-timing", quick.QUICK_TIMING, "step_timing", _write_quick_timing),
            turn("breakdown", quick.QUICK_TIMING, "breakdown")]


def summary_of(outcomes, check_name, timing_name):
    """The paste line's values from the step-check and step-timing outcomes (those that ran)."""
    summary = {}
    if "max_err" in getattr(outcomes.get(check_name), "result", {}):
        summary["max_err"] = outcomes[check_name].result["max_err"]
    if timing_name in outcomes:
        summary.update(quick.timing_summary(outcomes[timing_name].result.get("row", {})))
    return summary


def run_quick(out, budget, failures, skipped, notes, runner=run_isolated, env=None, warmup_names=None,
              tile_names=None, check_names=None):
    """The --quick units on the GPU (each in its own process by ``runner``); the summary (paste line) fields.
    ``warmup_names`` / ``tile_names`` / ``check_names``: the kernels to compile, the tile cases and the preflight
    checks (default: all)."""
    env, excluded = prepare(out, failures, runner, env, warmup_names, tile_names, check_names)
    turns = quick_turns()
    outcomes = run_in_turn(out, turns, budget, failures, skipped, notes, runner, env, excluded_tiles=excluded)
    return summary_of(outcomes, turns[0].name, turns[2].name)
