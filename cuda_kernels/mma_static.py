"""Static facts of compiled kernels, without a GPU: PTX instruction counts and ``ptxas -v``.

Used by the PTX test tier and by ``benchmarks/gpu/check.py --static``. ``ptxas`` comes from
the CUDA toolkit (on PATH on the development machines); ``ptxas_available()`` says whether
it is there.
"""
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .dynamic_smem import MAX_SHARED_PER_BLOCK, STATIC_SHARED_LIMIT
from ._mma import CP_ASYNC_PTX, LDMATRIX_PTX, LDMATRIX_TRANS_PTX, MMA_PTX

TENSOR_CORE_OPCODES = {"mma": MMA_PTX, "ldmatrix": LDMATRIX_PTX, "ldmatrix_trans": LDMATRIX_TRANS_PTX,
                       "cp_async": CP_ASYNC_PTX}


@dataclass(frozen=True)
class PtxasInfo:
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int


def shared_fits(static_bytes, dynamic_bytes, cc):
    """Whether a block's static (``ptxas -v``) + dynamic shared memory fits ``sm_<cc>``: the static part within
    48 KB, the sum within the architecture's opt-in maximum per block."""
    return static_bytes <= STATIC_SHARED_LIMIT and static_bytes + dynamic_bytes <= MAX_SHARED_PER_BLOCK[cc]


def ptxas_available():
    return shutil.which("ptxas") is not None


def instruction_counts(ptx):
    """How many times each tensor-core opcode occurs in the PTX text (static count)."""
    return {name: len(re.findall(re.escape(op) + r"\s", ptx)) for name, op in TENSOR_CORE_OPCODES.items()}


def ptxas_info(ptx, cc):
    """Assemble ``ptx`` for ``sm_<cc>`` with ``ptxas -v`` and parse its resource report."""
    arch = f"sm_{cc[0]}{cc[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        done = subprocess.run(["ptxas", f"-arch={arch}", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
                              capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"ptxas -arch={arch} failed: {done.stderr[-2000:]}")
    text = done.stderr + done.stdout

    def field(pattern):
        found = re.search(pattern, text)
        return int(found.group(1)) if found else 0
    return PtxasInfo(registers=field(r"Used (\d+) registers"),
                     spill_stores=field(r"(\d+) bytes spill stores"), spill_loads=field(r"(\d+) bytes spill loads"),
                     stack_bytes=field(r"(\d+) bytes stack frame"), shared_bytes=field(r"(\d+) bytes smem"))
