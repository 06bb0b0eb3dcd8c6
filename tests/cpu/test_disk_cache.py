"""numba's disk cache serves the CPU kernels to the next process, and never a stale one.

Each probe (tests/support/cache_probe.py) is a fresh process sharing one temporary NUMBA_CACHE_DIR
with the others of its test. The tests count numba's compilations ("numba:compile" events), not seconds:
the first process compiles, the second must compile nothing and compute the same; an edit of a scalar
pair, which lives in another file than the kernels compiled from it, must be compiled afresh.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cpu_ref._activation import source_fingerprint

ROOT = Path(__file__).resolve().parents[2]
PROBE = "tests.support.cache_probe"
PROBE_TIMEOUT_S = 600   # a hung probe fails the test instead of the run; a first probe takes ~15 s on 2 busy cores


def probe(cache_dir: Path, *args: str) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-m", PROBE, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=PROBE_TIMEOUT_S)
    assert done.returncode == 0, f"cache probe {args} failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.splitlines()[-1])


def test_a_second_process_compiles_no_kernel_of_a_training_step(tmp_path):
    first = probe(tmp_path, "every_kind")
    compiled = {name.split(":")[0] for name in first["compiled"]}
    assert {"cpu_ref._activation", "cpu_ref._norm", "cpu_ref._pool"} <= compiled, compiled
    # the convolutions: im2col (cpu_ref._conv) or direct kernels, as planner.conv_algorithm chose per layer
    assert compiled & {"cpu_ref._conv", "cpu_ref._conv_direct"}, compiled
    second = probe(tmp_path, "every_kind")
    again = [name for name in second["compiled"] if not _per_process(name, second["compiled"])]
    assert again == [], f"compiled again in a second process: {second['compiled']}"
    assert second["loss"] == first["loss"]   # the same machine code at the same inputs


# The direct convolutions (cpu_ref/_conv_direct.py: forward, input and weight gradient) are built per channel count
# at run time, their accumulators emitted as LLVM vectors of that width: numba cannot cache closures over those
# intrinsics, so each process compiles them (with the builtins they inline) once.
PER_PROCESS_MODULE = "cpu_ref._conv_direct"
PER_PROCESS_BUILTINS = ("numba.cpython.builtins:ol_max.<locals>.impl", "numba.cpython.builtins:ol_min.<locals>.impl")


def _per_process(name, compiled):
    if name.startswith(PER_PROCESS_MODULE + ":"):
        return True
    return name in PER_PROCESS_BUILTINS and any(n.startswith(PER_PROCESS_MODULE + ":") for n in compiled)


PAIR = """import numpy as np

_FACTOR = np.float32(2.0)


def pair(x, _a, _b):
    return _FACTOR * x


def pair_grad(x, dy, _a, _b):
    return _FACTOR * dy
"""
X = np.linspace(-2, 2, 9, dtype=np.float32)
EDITS = [   # (what changes, old text, new text, the pair's y and dx at X, dy = 1 after the edit)
    ("a constant the body reads", "np.float32(2.0)", "np.float32(3.0)", 3 * X, np.full_like(X, 3)),
    ("the body", "return _FACTOR * x\n", "return _FACTOR * x * x\n", 3 * X * X, np.full_like(X, 3)),
]


def _assert_pair_results(found, y, dx):
    for way in ("span", "parallel"):
        np.testing.assert_array_equal(np.float32(found[f"y_{way}"]), np.float32(y))
        np.testing.assert_array_equal(np.float32(found[f"dx_{way}"]), np.float32(dx))


def test_an_edited_scalar_pair_is_compiled_afresh_not_loaded_stale(tmp_path):
    (tmp_path / "edited_pair.py").write_text(PAIR)
    cache = tmp_path / "numba-cache"
    first = probe(cache, "pair", str(tmp_path))
    assert len(first["compiled"]) >= 4, first["compiled"]   # span and thread-pool loop, both directions
    _assert_pair_results(first, 2 * X, np.full_like(X, 2))
    assert probe(cache, "pair", str(tmp_path))["compiled"] == []   # unedited: loaded from the cache
    source = PAIR
    for what, old, new, y, dx in EDITS:
        source = source.replace(old, new)
        (tmp_path / "edited_pair.py").write_text(source)
        edited = probe(cache, "pair", str(tmp_path))
        assert len(edited["compiled"]) >= 4, f"after an edit of {what}: {edited['compiled']}"
        _assert_pair_results(edited, y, dx)


def _reads_a_function(x, alpha):
    return probe(x)   # the global `probe`: a function, whose repr would differ in every process


def test_a_scalar_body_reading_a_global_other_than_a_number_or_module_is_refused():
    with pytest.raises(TypeError, match=r"source_fingerprint: _reads_a_function \(.*test_disk_cache.py\) reads the "
                                        r"global 'probe', a function; expected a number or a module"):
        source_fingerprint(_reads_a_function)
