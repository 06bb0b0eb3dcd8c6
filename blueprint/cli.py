"""The `blueprint` command line (also `python -m blueprint`).

    blueprint models [--json]                        the model zoo
    blueprint plan resnet20 --batch 128 [--json]     layers, parameters, MACs and the memory plan
    blueprint plan path/to/net.py:bp --input-shape 28,28,1 --fuse --amp
    blueprint train [--model small_cnn] [--data digits] [--epochs N] [--json]   training (the default demo)
    blueprint predict CHECKPOINT INPUT.npy [--top-k 5] [--json]      classify samples with a trained checkpoint
    blueprint export CHECKPOINT --onnx OUT [--batch N]               the eval graph as ONNX

Each subcommand is one `add_<name>_command(subparsers)` function that declares its arguments
and sets `run`, the function that executes it and returns the exit status. A user error (an
unknown model, a file without the attribute, a shape that does not fit) prints one line,
`error: ...`, on stderr and exits with status 2.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys

from blueprint import __version__, zoo
from blueprint._model_source import CliError, load_model
from blueprint._summary import compile_plan, format_summary, layer_rows, text_table as _table
from blueprint._predict_command import add_export_command, add_predict_command
from blueprint._train_command import add_train_command
from planner import ExpandError, build_kind
from planner.plan import CompiledPlan
from planner.memory import lifetimes
from planner.ops import ShapeError
from planner.verify import PlanError

EXIT_USER_ERROR = 2
DEFAULT_BATCH = 32


#: What main() reports as one `error: <cause>; <fix>` line with exit status 2: the user-error family
#: (`ValueError`/`TypeError` and their subclasses: `ConfigError`, `ShapeError`, `ExpandError`,
#: `InputError`, ...) and the CLI's own. Anything else is a bug and keeps its traceback.
USER_ERRORS = (CliError, ExpandError, ShapeError, PlanError, ValueError, TypeError, FileNotFoundError)


def main(argv: list[str] | None = None) -> int:
    """Run the command line on `argv` (default `sys.argv[1:]`) and return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, --version, or a usage error argparse already printed
        return stop.code if isinstance(stop.code, int) else 0
    try:
        return args.run(args)
    except USER_ERRORS as error:
        print("error: " + " ".join(str(error).split()), file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # `blueprint plan resnet152 | head`: the reader left; leave quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as error:
        if error.errno not in FILE_SYSTEM_ERRNOS:
            raise
        print("error: " + file_system_message(error), file=sys.stderr)
        return EXIT_USER_ERROR


#: File-system refusals that are the user's to fix (a full disk, a read-only or mistyped path), reported as
#: one line; any other OSError is a bug and keeps its traceback.
FILE_SYSTEM_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENAMETOOLONG,
                      errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENOENT, errno.ELOOP}


def file_system_message(error: OSError) -> str:
    where = f" ({error.filename})" if error.filename else ""
    return (f"{error.strerror or error}{where}; nothing of the previous checkpoint was lost. Check the path, its "
            "permissions and the free space, or pass another --out")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blueprint", description="Plan, inspect and train declarative CNNs.")
    parser.add_argument("--version", action="version", version=f"blueprint-nn {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in SUBCOMMANDS:
        add_command(subparsers)
    return parser


# ---- blueprint models ---------------------------------------------------------------------------
def add_models_command(subparsers) -> None:
    command = subparsers.add_parser("models", help="list the model zoo",
                                    description="List every zoo model with its input shape and classes.")
    command.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    command.set_defaults(run=run_models)


def run_models(args) -> int:
    rows = [{"name": name, "input_shape": list(entry.input_shape), "num_classes": entry.num_classes,
             "summary": entry.summary} for name, entry in zoo.MODELS.items()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(_table(["model", "input (H,W,C)", "classes", "summary"],
                 [[r["name"], ",".join(map(str, r["input_shape"])), f"{r['num_classes']:,}", r["summary"]]
                  for r in rows], numeric={2}))
    return 0


# ---- blueprint plan -----------------------------------------------------------------------------
def add_plan_command(subparsers) -> None:
    command = subparsers.add_parser(
        "plan", help="compile a model and print its layers and memory plan",
        description="Expand and compile MODEL for a train and an eval variant, verify the memory plan, and "
                    "print every layer's output shape, parameters and MACs, and the arena's regions.")
    command.add_argument("model", metavar="MODEL",
                         help="a zoo name (see `blueprint models`) or path/to/file.py:attr, where attr is a "
                              "BluePrint or a function of no arguments returning one")
    command.add_argument("--batch", type=_positive_int, default=DEFAULT_BATCH, metavar="N",
                         help=f"training batch size (default {DEFAULT_BATCH})")
    command.add_argument("--eval-batch", type=_positive_int, default=None, metavar="N",
                         help="evaluation batch size (default: --batch)")
    command.add_argument("--input-shape", type=_input_shape, default=None, metavar="H,W,C",
                         help="one sample's shape; default: the zoo entry's (required for a file)")
    command.add_argument("--fuse", action="store_true", help="merge blocks into fused kernels (needs --amp)")
    command.add_argument("--amp", action="store_true", help="fp16 activations with fp32 master weights")
    command.add_argument("--depth", type=_positive_int, default=None, metavar="N",
                         help="group the layers by the first N components of their names (layer1.0.conv1 at "
                              "N=1 is layer1), as blueprint.summary(bp, shape, depth=N) does (default: every layer)")
    command.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    command.set_defaults(run=run_plan)


def run_plan(args) -> int:
    if args.fuse and not args.amp:
        raise CliError("--fuse needs --amp: the fused kernels are fp16-only; add --amp, or drop --fuse for the fp32 "
                       "reference plan")
    bp, input_shape = load_model(args.model, args.input_shape)
    plan = compile_plan(bp, input_shape, args.batch, args.eval_batch or args.batch, args.fuse, args.amp)
    report = plan_report(plan)
    if args.json:
        print(json.dumps({"model": args.model, "input_shape": list(input_shape), "batch": args.batch,
                          "eval_batch": args.eval_batch or args.batch, "fuse": args.fuse, "amp": args.amp,
                          **report}, indent=2))
        return 0
    mode = ("fp16 activations" if args.amp else "fp32") + (", fused" if args.fuse else ", unfused")
    print(format_summary(plan, args.depth,
                         f"{args.model}: train {plan.variants['train'].input_shape}, eval "
                         f"{plan.variants['eval'].input_shape}; {mode}; {len(report['layers'])} layers"))
    print()
    print(plan.memory.report())
    print(f"compiled in {plan.compile_ms:.1f} ms (train and eval variants); verify() found no error")
    print(f"planner build: {build_kind()}")
    return 0


def plan_report(plan: CompiledPlan) -> dict:
    """The JSON-ready summary: per-layer rows, memory totals and every tensor's slice and lifetime."""
    memory = plan.memory
    return {
        "params_trainable": plan.params_trainable,
        "macs_per_sample": sum(plan.macs_per_sample.values()),
        "layers": layer_rows(plan),
        "memory": {
            "regions": {name: nbytes for name, (_, nbytes) in memory.regions.items()},
            "arena_bytes": memory.arena_bytes,
            "transient_lower_bound_bytes": memory.transient_lower_bound_bytes,
            "transient_no_reuse_bytes": memory.transient_no_reuse_bytes,
            "transient_planned_bytes": memory.transient_planned_bytes,
            "saved_for_backward_bytes": memory.saved_for_backward_bytes,
            "fragmentation": memory.fragmentation,
        },
        "ops": {name: len(graph.ops) for name, graph in plan.graphs.items()},
        "tensors": tensor_rows(plan),
        "compile_ms": plan.compile_ms,
    }


def tensor_rows(plan: CompiledPlan) -> list[dict]:
    """Every tensor's slice of the arena; `first_op`/`last_op` index the schedule of its graph (the
    train graph for persistent tensors), null where that schedule never touches it."""
    spans = {name: lifetimes(graph) for name, graph in plan.graphs.items()}
    rows = []
    for t in plan.tensors:
        first, last = spans[t.graph or "train"].get(t.id, (None, None))
        rows.append({"name": t.name, "region": t.region, "graph": t.graph or None, "dtype": t.dtype,
                     "shape": list(t.shape), "offset": t.offset, "nbytes": t.nbytes,
                     "first_op": first, "last_op": last})
    return rows


# ---- helpers ------------------------------------------------------------------------------------
def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return int(text)


def _input_shape(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected H,W,C as three positive ints like 32,32,3, got {text!r}")
    return tuple(int(p) for p in parts)


# One function per subcommand, in `--help` order.
SUBCOMMANDS = (add_models_command, add_plan_command, add_train_command, add_predict_command, add_export_command)
