"""Builds the planner's Cython modules; everything else is declared in pyproject.toml."""
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

CYTHON_MODULES = ["planner._expand_c", "planner._memory_c"]

extensions = [
    Extension(name, [name.replace(".", "/") + ".pyx"], include_dirs=[numpy.get_include()])
    for name in CYTHON_MODULES
]

setup(ext_modules=cythonize(extensions, language_level=3, compiler_directives={"boundscheck": False, "wraparound": False}))
