"""The modules tests/null exercises import without numba: importing them never loads it (numba is
imported where a kernel first runs). `.ci/null-without-numba` runs the whole tier where numba is absent;
this checks the same on any environment, numba installed or not."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODULES = ["blueprint", "blueprint.cli", "blueprint._summary", "blueprint._parse", "blueprint.task",
           "blueprint.task._checkpoint", "blueprint.task.data", "planner", "planner.compiler", "planner.verify",
           "planner.scalar_activations"]
SCRIPT = ("import importlib, json, sys\n"
          "for name in sys.argv[1:]:\n"
          "    importlib.import_module(name)\n"
          "print(json.dumps(sorted(m for m in sys.modules if m == 'numba' or m.startswith('numba.'))))\n")


@pytest.mark.parametrize("module", MODULES)
def test_importing_does_not_load_numba(module):
    done = subprocess.run([sys.executable, "-c", SCRIPT, module], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [], f"importing {module} loaded numba"
