"""Where numba keeps the compiled CPU kernels: a per-user cache folder, never the installed package.

numba's default for `cache=True` is a `__pycache__` folder beside each kernel's source. In an
installed package that writes into site-packages, and the files outlive an uninstall: a later
`pip install -e .` then finds `cpu_ref/__pycache__` left in site-packages, which shadows the
editable install as a namespace package. So the kernels are cached in the user's cache folder
(`platformdirs.user_cache_dir("blueprint-nn")/numba`), or in `NUMBA_CACHE_DIR` when it is set.

numba chooses a kernel's cache folder when `@njit(cache=True)` decorates it, so
`use_user_cache_dir()` runs before any kernel module is imported (`cpu_ref/__init__.py`) and before
the data loader compiles its batch filler.
"""
import os

import platformdirs

CACHE_DIR_VARIABLE = "NUMBA_CACHE_DIR"
APP_NAME = "blueprint-nn"


def kernel_cache_dir() -> str:
    """The folder numba's kernel cache goes to: `NUMBA_CACHE_DIR` if set, else the user cache folder."""
    return os.environ.get(CACHE_DIR_VARIABLE) or os.path.join(platformdirs.user_cache_dir(APP_NAME), "numba")


def use_user_cache_dir() -> str:
    """Point numba's kernel cache at `kernel_cache_dir()`; returns that folder."""
    folder = kernel_cache_dir()
    os.environ[CACHE_DIR_VARIABLE] = folder
    from numba.core import config
    config.reload_config()    # numba read its environment when it was imported, maybe before this
    return folder
