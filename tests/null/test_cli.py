"""The `blueprint` command line, run in-process through `main(argv)`; one subprocess check of
`python -m blueprint`."""
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import planner
from blueprint import __version__, zoo
from blueprint.cli import main
from blueprint._model_source import CliError
from planner import _build

REPO = Path(__file__).resolve().parents[2]
USER_MODEL = """
    from blueprint import *

    bp = BluePrint(seq(conv(8, 3, 1, 1), bn(), relu(), gap(), fc(4)))
    layer = seq(conv(8, 3, 1, 1), gap(), fc(4))
    number = 3

    def make():
        return bp

    def make_sized(width):
        return BluePrint(seq(conv(width, 3, 1, 1), gap(), fc(4)))

    unfusable = BluePrint(seq(cbr(12, 3, 1, 1), cbr(12, 3, 1, 1), gap(), fc(4)))
"""
USER_MODEL_PARAMS = (3 * 3 * 3 * 8) + 2 * 8 + 8 * 4 + 4


@pytest.fixture
def net_py(tmp_path) -> Path:
    path = tmp_path / "net.py"
    path.write_text(textwrap.dedent(USER_MODEL))
    return path


def run_json(capsys, *argv) -> dict:
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def test_help_and_version(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "models" in out and "plan" in out
    assert main(["plan", "--help"]) == 0
    assert "--input-shape" in capsys.readouterr().out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"blueprint-nn {__version__}"


def test_no_subcommand_is_a_usage_error(capsys):
    assert main([]) == 2
    assert "error:" in capsys.readouterr().err


def test_models_lists_every_zoo_model(capsys):
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = [line.split()[0] for line in lines[2:]]
    assert listed == list(zoo.MODELS)
    rows = run_json(capsys, "models")
    assert [r["name"] for r in rows] == list(zoo.MODELS)
    for row in rows:
        entry = zoo.MODELS[row["name"]]
        assert tuple(row["input_shape"]) == entry.input_shape and row["num_classes"] == entry.num_classes
        assert row["summary"] == entry.summary


def _assert_consistent(report: dict, batch: int) -> None:
    layers, memory, tensors = report["layers"], report["memory"], report["tensors"]
    assert {"name", "kind", "out_shape", "params", "macs"} <= set(layers[0])
    assert report["params_trainable"] == sum(l["params"] for l in layers)
    assert report["macs_per_sample"] == sum(l["macs"] for l in layers) > 0
    assert layers[-1]["kind"] == "softmax_ce"
    assert layers[-2]["out_shape"][0] == batch
    arena = memory["arena_bytes"]
    assert set(memory) >= {"regions", "arena_bytes", "transient_lower_bound_bytes", "transient_no_reuse_bytes",
                           "transient_planned_bytes", "saved_for_backward_bytes"}
    assert sum(memory["regions"].values()) <= arena
    assert memory["regions"]["transient"] == memory["transient_planned_bytes"]
    assert 0 < memory["transient_lower_bound_bytes"] <= memory["transient_planned_bytes"]
    assert memory["transient_planned_bytes"] <= memory["transient_no_reuse_bytes"]
    assert 0 < memory["saved_for_backward_bytes"] <= memory["regions"]["saved"] + memory["regions"]["transient"]
    assert report["compile_ms"] > 0
    for t in tensors:
        assert {"name", "region", "offset", "nbytes", "first_op", "last_op"} <= set(t)
        assert t["region"] in memory["regions"]
        assert 0 <= t["offset"] and t["offset"] + t["nbytes"] <= arena
        if t["graph"] == "train":
            assert 0 <= t["first_op"] <= t["last_op"] < report["ops"]["train"]
        elif t["graph"] is None and t["first_op"] is not None:
            assert 0 <= t["first_op"] <= t["last_op"] < report["ops"]["train"]
    assert all(t["graph"] is None for t in tensors if t["first_op"] is None)  # only persistent ones go untouched
    by_region = {}
    for t in tensors:
        by_region[t["region"]] = by_region.get(t["region"], 0) + t["nbytes"]
    assert by_region["params"] <= memory["regions"]["params"]
    _assert_no_live_overlap([t for t in tensors if t["graph"] == "train" and t["nbytes"]])


def _assert_no_live_overlap(tensors: list[dict]) -> None:
    """Recheck the plan from the JSON alone: tensors live at once never share bytes."""
    for i, a in enumerate(tensors):
        for b in tensors[i + 1:]:
            live_together = a["first_op"] <= b["last_op"] and b["first_op"] <= a["last_op"]
            overlap = a["offset"] < b["offset"] + b["nbytes"] and b["offset"] < a["offset"] + a["nbytes"]
            assert not (live_together and overlap), (a, b)


def test_plan_json_of_a_zoo_model_is_complete_and_consistent(capsys):
    report = run_json(capsys, "plan", "resnet20", "--batch", "4", "--eval-batch", "2")
    assert report["params_trainable"] == 272_474
    assert report["input_shape"] == [32, 32, 3] and report["batch"] == 4 and report["eval_batch"] == 2
    assert len(report["layers"]) == 73
    assert report["layers"][0] == {"name": "conv1", "kind": "conv", "out_shape": [4, 32, 32, 16], "params": 432,
                                   "macs": 32 * 32 * 16 * 27}
    _assert_consistent(report, batch=4)
    persistent = [t for t in report["tensors"] if t["graph"] is None]
    assert {t["region"] for t in persistent} >= {"params", "grads", "optim", "bn_stats", "io", "scalars"}
    grads = [t for t in persistent if t["region"] == "grads"]
    assert grads and all(t["first_op"] is not None for t in grads)  # written in backward, read by the optimizer
    eval_tensors = [t for t in report["tensors"] if t["graph"] == "eval"]
    assert eval_tensors and all(t["last_op"] < report["ops"]["eval"] for t in eval_tensors)


def test_plan_fused_lists_fused_layers_with_their_totals(capsys):
    unfused = run_json(capsys, "plan", "resnet20", "--batch", "4")
    fused = run_json(capsys, "plan", "resnet20", "--batch", "4", "--fuse", "--amp")
    _assert_consistent(fused, batch=4)
    assert [l["kind"] for l in fused["layers"]] == ["cbr"] + ["basic_block"] * 9 + ["gap_fc", "softmax_ce"]
    assert fused["params_trainable"] == unfused["params_trainable"]
    assert fused["macs_per_sample"] == unfused["macs_per_sample"]
    assert fused["memory"]["regions"]["weights16"] > 0 == unfused["memory"]["regions"]["weights16"]


def test_plan_prints_a_layer_table_and_the_memory_report(capsys):
    assert main(["plan", "small_cnn", "--batch", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("small_cnn: train (8, 8, 8, 1), eval (8, 8, 8, 1)")
    assert "MACs" in out and "(8, 8, 8, 32)" in out
    total = next(line for line in out.splitlines() if line.startswith("trainable params"))
    assert "56,554" in total
    assert "arena" in out and "lower bound" in out and "KiB" in out
    assert "compiled in" in out and "verify() found no error" in out
    assert out.splitlines()[-1] == f"planner build: {planner.build_kind()}"


@pytest.mark.parametrize("pure, kind", [("1", "pure-python"), ("0", None)])
def test_plan_says_which_planner_build_ran(capsys, monkeypatch, pure, kind):
    monkeypatch.setenv("BLUEPRINT_PURE_PYTHON", pure)
    expected = kind or ("cython" if all(_build.is_compiled(importlib.import_module(m)) for m in _build.CYTHON_MODULES)
                        else "pure-python")
    assert main(["plan", "mlp", "--batch", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"planner build: {expected}"


@pytest.mark.parametrize("attr", ["bp", "make"])
def test_plan_of_a_user_file(capsys, net_py, attr):
    report = run_json(capsys, "plan", f"{net_py}:{attr}", "--input-shape", "8,8,3", "--batch", "2")
    assert report["params_trainable"] == USER_MODEL_PARAMS
    assert [l["kind"] for l in report["layers"]] == ["conv", "bn2d", "relu", "gap", "fc", "softmax_ce"]
    _assert_consistent(report, batch=2)


ERRORS = [
    (["plan", "nope"], "unknown model 'nope'"),
    (["plan", "resnet20", "--input-shape", "32,32"], "--input-shape: expected H,W,C"),
    (["plan", "resnet20", "--input-shape", "32,x,3"], "--input-shape: expected H,W,C"),
    (["plan", "resnet20", "--input-shape", "0,32,3"], "--input-shape: expected H,W,C"),
    (["plan", "resnet20", "--batch", "0"], "--batch: expected a positive int"),
    (["plan", "resnet20", "--fuse"], "--fuse needs --amp: the fused kernels are fp16-only; add --amp"),
    (["plan", "small_cnn", "--input-shape", "1,1,1"], "seq[1].cbrp.maxpool: maxpool with kernel 2x2"),
    (["plan", "{net}:missing", "--input-shape", "8,8,3"], "has no attribute 'missing'; BluePrints it defines: bp"),
    (["plan", "{net}:layer", "--input-shape", "8,8,3"], "wrap the layer as BluePrint(layer)"),
    (["plan", "{net}:number", "--input-shape", "8,8,3"], "has type int, expected a BluePrint"),
    (["plan", "{net}:make_sized", "--input-shape", "8,8,3"], "is a callable that needs arguments"),
    (["plan", "{net}:bp"], "needs --input-shape H,W,C"),
    (["plan", "{net}", "--input-shape", "8,8,3"], "name the BluePrint in the file after a colon"),
    (["plan", "{net}:unfusable", "--input-shape", "8,8,3", "--fuse", "--amp"], "multiples of 8"),
    (["plan", "{dir}/absent.py:bp", "--input-shape", "8,8,3"], "no such file"),
    (["plan", "{broken}:bp", "--input-shape", "8,8,3"], "running the file raised ValueError: conv(): out_ch"),
    (["plan", "resnet20", "--batch", str(10**20)], "more than one plan can address (2**60 bytes); lower the batch"),
    (["plan", "{huge}:bp", "--input-shape", "8,8,3"], "conv(): out_ch must be at most 2**31-1, got " + str(10**30)),
    (["plan", "{factories}:unknown_zoo_name", "--input-shape", "8,8,3"],
     "unknown_zoo_name() raised UnknownModelError: unknown zoo model 'resnet21'; known models: small_cnn, mlp"),
    (["plan", "{factories}:key_error", "--input-shape", "8,8,3"], "key_error() raised KeyError: 'depth'"),
    (["train", "--data", "cifar10"], "got 'cifar10'; name the folder of the binary CIFAR-10 files after the colon"),
    (["train", "--data", "cifar10:"], "got 'cifar10:'; name the folder of the binary CIFAR-10 files after the colon"),
]
FACTORIES = """
    from blueprint import zoo

    def unknown_zoo_name():
        return zoo.MODELS["resnet21"].build()

    def key_error():
        return {}["depth"]
"""


@pytest.mark.parametrize("argv, message", ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_errors_exit_2_with_a_one_line_message(capsys, net_py, argv, message):
    broken = net_py.parent / "broken.py"
    broken.write_text("from blueprint import *\nbp = BluePrint(seq(conv(0, 3)))\n")
    huge = net_py.parent / "huge.py"
    huge.write_text("from blueprint import *\nbp = BluePrint(seq(conv(10**30, 3), gap(), fc(4)))\n")
    factories = net_py.parent / "factories.py"
    factories.write_text(textwrap.dedent(FACTORIES))
    argv = [a.format(net=net_py, dir=net_py.parent, broken=broken, huge=huge, factories=factories) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    last = captured.err.strip().splitlines()[-1]
    assert "error: " in last and message in last
    assert "Traceback" not in captured.err


def test_python_dash_m_blueprint_help():
    env = dict(os.environ, BLUEPRINT_PURE_PYTHON="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "blueprint", "--help"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: blueprint" in done.stdout and "plan" in done.stdout


WITHOUT_NUMBA_CUDA = ("import sys\n"
                      "sys.modules['numba_cuda'] = None   # as where numba alone (its own numba.cuda) is installed\n"
                      "from blueprint.cli import main\n"
                      "sys.exit(main(sys.argv[1:]))\n")


def test_device_cuda_without_numba_cuda_names_the_extra(tmp_path):
    done = subprocess.run([sys.executable, "-c", WITHOUT_NUMBA_CUDA, "train", "--device", "cuda", "--epochs", "1",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --device cuda needs numba-cuda (numba-cuda is not installed") and \
        "pip install \".[cuda]\" in the blueprint-nn source tree" in last
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("argv, message", [
    (["--nproc-per-node", "2", "--batch-size", "33"],
     "--batch-size 33 is the global batch and does not divide over the 2 workers (--nproc-per-node 2 x --nnodes 1); "
     "pass a multiple of 2, e.g. --batch-size 32"),
    (["--nproc-per-node", "4", "--nnodes", "2", "--rdzv-endpoint", "h:1", "--batch-size", "4"],
     "does not divide over the 8 workers (--nproc-per-node 4 x --nnodes 2); pass a multiple of 8, e.g. --batch-size 8"),
])
def test_a_global_batch_that_does_not_divide_over_the_workers_is_refused_before_launching(argv, message):
    from blueprint.cli import build_parser
    from blueprint._launch import launcher_arguments
    args = build_parser().parse_args(["train", *argv])
    with pytest.raises(CliError) as caught:
        launcher_arguments(args, ["train"])
    assert message in str(caught.value) and "\n" not in str(caught.value)
    args = build_parser().parse_args(["train", *argv[:-1], "8"])   # a multiple of the workers launches
    assert launcher_arguments(args, ["train"])[:2] == ["--nproc-per-node", argv[1]]
