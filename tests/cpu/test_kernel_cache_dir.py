"""numba caches the CPU kernels in the user's cache folder (or NUMBA_CACHE_DIR), never beside their source.

Beside the source means inside site-packages for an installed package, where the cache folders outlive
an uninstall and shadow a later editable install (issue 26). A fresh process imports the kernels and
reports the folder each `cache=True` kernel would write to; no kernel needs compiling for that.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300
REPORT_CACHE_FOLDERS = """
import json, sys
import cpu_ref
from numba.core.dispatcher import Dispatcher
from blueprint.task.data._loader import _fill_batch_kernel
kernels = [value for name, module in list(sys.modules.items()) if name.split(".")[0] == "cpu_ref"
           for value in vars(module).values() if isinstance(value, Dispatcher)]
kernels.append(_fill_batch_kernel())
print(json.dumps({"kernels": len(kernels), "folders": sorted({k._cache._cache_path for k in kernels})}))
"""


def cache_folders(**env_changes) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "NUMBA_CACHE_DIR"}
    env.update(env_changes)
    done = subprocess.run([sys.executable, "-c", REPORT_CACHE_FOLDERS], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_kernels_are_cached_in_the_user_cache_folder_not_in_the_package(tmp_path):
    report = cache_folders(XDG_CACHE_HOME=str(tmp_path))
    assert report["kernels"] > 50    # every CPU kernel module, and the data loader's
    expected = tmp_path / "blueprint-nn" / "numba"
    outside = [folder for folder in report["folders"] if Path(folder).parent != expected]
    assert not outside, f"kernel cache folders outside {expected}: {outside}"


def test_numba_cache_dir_set_by_the_user_wins(tmp_path):
    chosen = tmp_path / "chosen"
    report = cache_folders(XDG_CACHE_HOME=str(tmp_path / "xdg"), NUMBA_CACHE_DIR=str(chosen))
    assert {Path(folder).parent for folder in report["folders"]} == {chosen}
