"""Bounded by construction (issue 24, items 1-3): no tree or text crashes the process or exhausts
memory. The expander refuses a tree nested past `MAX_NESTING_DEPTH` or expanding past
`MAX_EXPANDED_LAYERS` in both builds, before building a record; a checkpoint naming such a
model is one `error:` line, never a signal; the parser's string and text limits hold before it
tokenises."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from blueprint import cbr, named, relu, repeat, seq
from blueprint.cli import main
from blueprint import ConfigError
from blueprint._parse import MAX_STRING_CHARS, MAX_TEXT_CHARS, parse_value
from blueprint.task import save_checkpoint
from planner import ExpandError
from planner._bounds import MAX_EXPANDED_LAYERS, MAX_NESTING_DEPTH, measure
from planner._build import source

ROOT = Path(__file__).resolve().parents[2]
TWINS = {"cython": importlib.import_module("planner._expand").expand_tree,
         "pure": source("planner._expand").expand_tree}


def chain(links: int):
    net = cbr(4, 3, 1, 1)
    for _ in range(links):
        net = seq(net, relu())
    return net


@pytest.mark.parametrize("build", TWINS)
def test_the_deepest_accepted_tree_expands_in_both_builds(build):
    tree = chain(MAX_NESTING_DEPTH - 1)       # the cbr leaf is the last level
    assert measure(tree)[0] == MAX_NESTING_DEPTH
    records = TWINS[build](tree, 4)
    assert sum(r[0] == "relu" for r in records) == MAX_NESTING_DEPTH   # the chain's and the cbr's


@pytest.mark.parametrize("build", TWINS)
def test_a_tree_one_level_too_deep_is_refused_with_its_depth(build):
    with pytest.raises(ExpandError, match=f"nested {MAX_NESTING_DEPTH + 1:,} levels deep; .* at most "
                                          f"{MAX_NESTING_DEPTH:,}"):
        TWINS[build](chain(MAX_NESTING_DEPTH), 4)


@pytest.mark.parametrize("build", TWINS)
@pytest.mark.parametrize("tree, count", [
    (repeat(relu(), 10**9), 10**9),
    (repeat(repeat(relu(), 1000), 1000), 10**6),                 # repeat counts multiply
    (seq(cbr(4, 3, 1, 1), repeat(relu(), MAX_EXPANDED_LAYERS)), MAX_EXPANDED_LAYERS + 1),
])
def test_expanded_layer_count_is_refused_before_expanding(build, tree, count):
    with pytest.raises(ExpandError, match=f"expands to {count:,} layers.*at most {MAX_EXPANDED_LAYERS:,}"):
        TWINS[build](tree, 4)


def test_shared_subtrees_are_measured_once():
    tree = relu()
    for _ in range(60):
        tree = seq(tree, tree)      # 2**60 leaves, 61 distinct nodes
    assert measure(tree) == (61, 2**60)


def test_plan_of_100k_layers_is_refused(tmp_path, capsys):
    source_file = tmp_path / "wide.py"
    source_file.write_text("from blueprint import BluePrint, cbr, fc, gap, relu, repeat, seq\n"
                           "bp = BluePrint(seq(cbr(4, 3, 1, 1), repeat(relu(), 100_000), gap(), fc(2)))\n")
    assert main(["plan", f"{source_file}:bp", "--input-shape", "8,8,4", "--batch", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the network expands to 100,003 layers")


DEEP_MODELS = {
    "closed": "BluePrint(" + "seq(" * 100_000 + "relu()" + ")" * 100_001,
    "unclosed": "seq(" * 100_000,
}


@pytest.mark.parametrize("build", ["compiled", "pure"])
@pytest.mark.parametrize("model", DEEP_MODELS)
def test_a_checkpoint_naming_a_deep_model_is_one_error_line_not_a_signal(tmp_path, build, model):
    checkpoint = tmp_path / "deep.safetensors"
    spec = {"layout": "NHWC", "sample_shape": [4, 4, 1], "dtype": "float32", "mean": None, "std": None,
            "low": None, "high": None}
    save_checkpoint(checkpoint, {}, {"blueprint": DEEP_MODELS[model], "input": spec})
    np.save(tmp_path / "x.npy", np.zeros((1, 4, 4, 1), np.float32))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BLUEPRINT_PURE_PYTHON": "1" if build == "pure" else "0"}
    done = subprocess.run([sys.executable, "-m", "blueprint", "predict", str(checkpoint), str(tmp_path / "x.npy")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stderr
    assert ("nested 100,001 levels" if model == "closed" else "expected a value, found the end of the text") in lines[0]


# ---- the parser's limits -------------------------------------------------------------------------------
def test_a_long_string_is_refused_before_tokenising_it():
    text = "named('" + "a" * (MAX_STRING_CHARS + 1) + "', relu())"
    with pytest.raises(ConfigError, match=f"string of more than {MAX_STRING_CHARS:,} characters"):
        parse_value(text)
    name = "a" * 100
    assert parse_value(f"named('{name}', relu())") == named(name, relu())


def test_a_text_past_the_limit_is_refused_by_its_length():
    with pytest.raises(ConfigError, match=f"{MAX_TEXT_CHARS + 1:,} characters; at most {MAX_TEXT_CHARS:,}"):
        parse_value(" " * MAX_TEXT_CHARS + "1")


def test_string_tokens_are_read_in_constant_memory_per_character():
    """A string literal of many escapes was one regex repetition per character (about 230 bytes of
    the regex engine's stack each); it is now read with `str.find`-style scans."""
    import tracemalloc
    body = "\\'" * (MAX_STRING_CHARS // 2 - 1)
    text = f"named('{body}', relu())"
    tracemalloc.start()
    try:
        parse_value(text)
    except ConfigError:
        pass          # named() refuses the name itself; the tokeniser has read it
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 40 * len(text), f"peak {peak} bytes for {len(text)} characters"
