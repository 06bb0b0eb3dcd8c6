"""Builds the planner's two Cython modules; everything else is declared in pyproject.toml.

Each is one source in Cython's pure-Python mode: `planner/_expand.py` and `planner/_memory.py`,
typed by the `.pxd` beside them. The extension lands next to its source and Python's import
system prefers it; without a build the same `.py` runs uncompiled (see `planner/_build.py`).
"""
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

CYTHON_MODULES = ["planner._expand", "planner._memory"]

extensions = [
    Extension(name, [name.replace(".", "/") + ".py"], include_dirs=[numpy.get_include()])
    for name in CYTHON_MODULES
]

setup(ext_modules=cythonize(extensions, language_level=3, compiler_directives={"boundscheck": False, "wraparound": False}))
