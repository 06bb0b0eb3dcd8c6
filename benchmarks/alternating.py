"""Two sides of a CPU comparison, each in its own process, alternated over rounds.

In one process the two thread pools (numba's and torch's OpenMP) disturb each other: the same
pair read 1.04-1.69x depending on which ran first. Here every round starts a fresh process per
side, in alternating order (ours first in even rounds, PyTorch's first in odd ones), each with
the same thread count for every pool it has: numba's, the BLAS libraries' and OpenMP's, so no
pool oversubscribes the cores. A child prints one JSON line; the parent keeps the last one.

An instruction-set stand-in (`STANDINS`) lowers both sides on an AVX-512 machine to what an AVX2
machine runs: numba's target and OpenBLAS's kernel set for ours, ATen's kernels and oneDNN's ISA
for PyTorch's. `runtime_info` reports what each side actually used.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Environment of each instruction-set stand-in (both sides get all of it).
STANDINS = {
    "native": {},
    "avx2": {
        "OPENBLAS_CORETYPE": "Haswell",                      # OpenBLAS's AVX2 kernel set
        "NUMBA_CPU_NAME": "haswell",                         # numba's LLVM target ...
        "NUMBA_CPU_FEATURES": "+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+lzcnt,+popcnt,+movbe,+sse4.2,-avx512f",
        "ATEN_CPU_CAPABILITY": "avx2",                       # PyTorch's own kernels
        "ONEDNN_MAX_CPU_ISA": "AVX2",                        # PyTorch's convolutions
    },
}

_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS")


def child_environment(threads: int, standin: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({name: str(threads) for name in _THREAD_VARIABLES})
    env.update(STANDINS[standin])
    return env


def run_child(module: str, args: list[str], env: dict[str, str], timeout: float = 900) -> dict:
    """Run ``python -m module args`` from the repository root and return the JSON object its last stdout line holds."""
    done = subprocess.run([sys.executable, "-m", module, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{module} {' '.join(args)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def alternate(run_ours, run_theirs, rounds: int) -> list[tuple[dict, dict]]:
    """``rounds`` pairs of child results, each round's order alternating."""
    pairs = []
    for r in range(rounds):
        if r % 2 == 0:
            ours = run_ours()
            theirs = run_theirs()
        else:
            theirs = run_theirs()
            ours = run_ours()
        pairs.append((ours, theirs))
    return pairs


def ratio_summary(ours: list[float], theirs: list[float]) -> str:
    """``median [min-max]`` of the pairwise ratios ours / theirs."""
    ratios = [o / t for o, t in zip(ours, theirs)]
    return f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"


def ms_summary(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1e3:.1f} [{min(seconds) * 1e3:.1f}-{max(seconds) * 1e3:.1f}]"


def _numba_vector_registers() -> str:
    """The widest vector registers numba's code for a plain loop uses (what its target really emits)."""
    import numpy as np
    from numba import njit

    @njit(fastmath=True)
    def axpy(a, b):
        for i in range(a.size):
            a[i] += np.float32(2.0) * b[i]

    a = np.zeros(64, np.float32)
    axpy(a, a)
    asm = axpy.inspect_asm(axpy.signatures[0])
    return next((isa for isa, reg in (("AVX-512 (zmm)", "%zmm"), ("AVX2 (ymm)", "%ymm"), ("SSE (xmm)", "%xmm"))
                 if reg in asm), "scalar")


def _blas_kernel_sets() -> list[str]:
    """``library architecture`` of every BLAS loaded in this process (threadpoolctl)."""
    from threadpoolctl import threadpool_info
    return sorted({f"{_library_name(i['filepath'])} {i.get('architecture')}" for i in threadpool_info()
                   if i.get("user_api") == "blas"})


def _library_name(path: str) -> str:
    """``libscipy_openblas`` of ``.../libscipy_openblas-6cdc3b4a.so``."""
    return os.path.basename(path).split("-")[0].split(".")[0]


def runtime_info(side: str) -> dict:
    """What this process computes with: numba's target and vector width, or ATen's capability; the BLAS kernel sets."""
    if side == "ours":
        import llvmlite.binding as ll
        from numba.core import config
        info = {"numba_target": config.CPU_NAME or ll.get_host_cpu_name(), "numba_vectors": _numba_vector_registers()}
    else:
        import torch
        info = {"aten_capability": torch.backends.cpu.get_cpu_capability()}
    info["blas"] = _blas_kernel_sets()
    return info
