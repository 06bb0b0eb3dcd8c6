"""Planner speed (asv). The memory plan's quality is `benchmarks/planner_memory.py`.

asv:    `asv run --bench bench_planner` from the repository root (see asv.conf.json) times
        `expand_tree`, `ArchPlan.from_blueprint` and a full `Compiler(arch).compile()` with three variants (train, train_last, eval) for
        resnet20, resnet50, resnet152 and mobilenet_v2, each with the Cython build and with the
        same sources uncompiled.
script: `python -m benchmarks.bench_planner` prints the same times (median and fastest of repeated
        runs) with the Cython/pure speedup.

The builds are selected by calling the compiled `planner._expand` / `planner._memory` or their
`.py` source loaded uncompiled (`planner._build.source`) directly, not through
BLUEPRINT_PURE_PYTHON. Times are process CPU time: the planner is single-threaded, and CPU time
is not inflated by other load on a shared machine.
"""
from __future__ import annotations

import contextlib
import importlib
import statistics
import sys
import time

import planner.expand
import planner.memory
from blueprint import zoo
from planner import ArchPlan
from planner._build import BUILD_COMMAND, is_compiled, source
from planner.compiler import Compiler

_expand_c, _memory_c = importlib.import_module("planner._expand"), importlib.import_module("planner._memory")
_expand_py, _memory_py = source("planner._expand"), source("planner._memory")

MODELS = ("resnet20", "resnet50", "resnet152", "mobilenet_v2")
BUILDS = ("cython", "pure")
EXPANDERS = {"cython": _expand_c.expand_tree, "pure": _expand_py.expand_tree}
ALLOCATORS = {"cython": _memory_c, "pure": _memory_py}
TRAIN_BATCH, TRAIN_LAST_BATCH, EVAL_BATCH = 32, 16, 8


def variants(model: str) -> dict[str, tuple[int, int, int, int]]:
    hwc = zoo.MODELS[model].input_shape
    return {"train": (TRAIN_BATCH, *hwc), "train_last": (TRAIN_LAST_BATCH, *hwc), "eval": (EVAL_BATCH, *hwc)}


@contextlib.contextmanager
def using(build: str):
    """Run the planner with one build of the expander and the offset allocator."""
    saved = planner.expand._expander, planner.memory.plan_offsets
    planner.expand._expander = lambda: EXPANDERS[build]
    planner.memory.plan_offsets = ALLOCATORS[build].plan_offsets
    try:
        yield
    finally:
        planner.expand._expander, planner.memory.plan_offsets = saved


# ---- asv ------------------------------------------------------------------------------------------
class ExpandTree:
    """The tree walk alone (compiled vs uncompiled); setup checks both give the same records."""

    params = (MODELS, BUILDS)
    param_names = ("model", "build")
    timer = time.process_time

    def setup(self, model, build):
        self.bp = zoo.MODELS[model].build()
        self.channels = zoo.MODELS[model].input_shape[2]
        if not is_compiled(_expand_c):
            raise NotImplementedError(f"planner._expand is not compiled: run {BUILD_COMMAND}")
        records = EXPANDERS[build](self.bp.root, self.channels)
        if records != _expand_py.expand_tree(self.bp.root, self.channels):
            raise AssertionError(f"{model}: the {build} expander disagrees with its source run uncompiled")

    def time_expand_tree(self, model, build):
        EXPANDERS[build](self.bp.root, self.channels)


class FromBlueprint:
    """`ArchPlan.from_blueprint`: expand_tree plus the normalisation passes, unfused and fused."""

    params = (MODELS, BUILDS, (False, True))
    param_names = ("model", "build", "fuse")
    timer = time.process_time

    def setup(self, model, build, fuse):
        self.bp = zoo.MODELS[model].build()
        self.context = using(build)
        self.context.__enter__()
        ArchPlan.from_blueprint(self.bp, fuse=fuse, amp=fuse)

    def teardown(self, model, build, fuse):
        self.context.__exit__(None, None, None)

    def time_from_blueprint(self, model, build, fuse):
        ArchPlan.from_blueprint(self.bp, fuse=fuse, amp=fuse)


class Compile:
    """A full compile with three variants; setup verifies the plan."""

    params = (MODELS, BUILDS)
    param_names = ("model", "build")
    timer = time.process_time

    def setup(self, model, build):
        self.arch = ArchPlan.from_blueprint(zoo.MODELS[model].build())
        self.variants = variants(model)
        self.context = using(build)
        self.context.__enter__()
        Compiler(self.arch).compile(self.variants).verify()

    def teardown(self, model, build):
        self.context.__exit__(None, None, None)

    def time_compile(self, model, build):
        Compiler(self.arch).compile(self.variants)


# ---- script mode ----------------------------------------------------------------------------------
def cpu_ms(fn, budget_s: float = 2.0, least: int = 21) -> tuple[float, float]:
    """(median, fastest) of repeated runs in CPU ms. On a shared machine the median moves with other
    load; the fastest run is the least disturbed one."""
    times, start = [], time.process_time()
    while len(times) < least or time.process_time() - start < budget_s:
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def speed_table() -> str:
    head = (f"{'model':<14}{'expand_tree C':>14}{'pure':>9}{'x':>6}{'from_bp C':>11}{'pure':>9}{'x':>6}"
            f"{'compile C':>11}{'(fastest)':>10}{'pure':>9}{'x':>6}")
    lines = ["CPU ms, median of repeated runs; compile = 3 variants (train, train_last, eval); x = pure / Cython",
             head]
    for model in MODELS:
        bp, channels = zoo.MODELS[model].build(), zoo.MODELS[model].input_shape[2]
        row = {}
        for build in BUILDS:
            with using(build):
                row["expand", build] = cpu_ms(lambda: EXPANDERS[build](bp.root, channels))
                row["from_bp", build] = cpu_ms(lambda: ArchPlan.from_blueprint(bp))
                arch = ArchPlan.from_blueprint(bp)
                Compiler(arch).compile(variants(model)).verify()
                row["compile", build] = cpu_ms(lambda: Compiler(arch).compile(variants(model)))
        cells = ""
        for what, width in (("expand", 14), ("from_bp", 11), ("compile", 11)):
            (c_median, c_fastest), (pure_median, _) = row[what, "cython"], row[what, "pure"]
            fastest = f"{c_fastest:>10.2f}" if what == "compile" else ""
            cells += f"{c_median:>{width}.2f}{fastest}{pure_median:>9.2f}{pure_median / c_median:>6.1f}"
        lines.append(f"{model:<14}{cells}")
    return "\n".join(lines)


if __name__ == "__main__":
    if not (is_compiled(_expand_c) and is_compiled(_memory_c)):
        sys.exit(f"the planner's Cython modules are not compiled: run {BUILD_COMMAND} first")
    print(speed_table())
