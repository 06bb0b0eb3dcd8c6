"""What a compiled kernel executes, read from its SASS (no GPU): the main loop's instruction mix.

``ptxas`` (CUDA toolkit, on PATH) assembles a kernel's PTX into a cubin; ``cuobjdump --dump-sass``
(pip wheels ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``, found on PATH or in the wheel's
``bin/``) prints its instructions. The main loop of a tensor-core kernel is the backward branch whose
body holds the HMMAs (the smallest such body: the k-tile loop, not a loop around it); its static
instructions per HMMA bound how fast a warp can feed the tensor cores. Counts are static (every
instruction of the body once, both sides of a branch), per warp and k-tile.
"""
import functools
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

# an opcode's modifiers may hold a lower-case vector width: REDG.E.ADD.F32x4, HADD2.F16x2
SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*(?:x\d[A-Z0-9_.]*)?)\s*([^;]*);")
BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)")
# sm_90: per SM, and the allocation granularities the occupancy calculator uses
SM90 = dict(registers=65536, register_unit=256, warps=64, blocks=32, shared=233472, shared_reserved=1024)


@dataclass(frozen=True)
class Instruction:
    address: int
    predicate: str
    opcode: str
    operands: str

    @property
    def base(self):
        return self.opcode.split(".")[0]

    @property
    def is_64bit_integer(self):
        """A 64-bit integer half: carry-in ``.X``, compare-extension ``.EX``, ``IMAD.WIDE``, ``.64`` shifts/moves."""
        mods = set(self.opcode.split(".")[1:])
        base = self.base[1:] if self.base.startswith("U") else self.base   # uniform-datapath twins
        return base in ("IADD3", "IMAD", "LEA", "ISETP", "SHF", "IADD", "IABS", "LOP3", "SEL", "MOV") and bool(
            mods & {"X", "EX", "WIDE", "64", "S64", "U64"})


@dataclass(frozen=True)
class LoopStats:
    instructions: int
    hmma: int
    int64_ops: int
    ldgsts: int
    ldsm: int
    bar: int
    branches: int

    @property
    def per_hmma(self):
        return self.instructions / self.hmma if self.hmma else float("inf")


def tool(name):
    """Path of a CUDA binary tool: PATH first, then the nvidia pip wheels' ``bin/`` folders."""
    found = shutil.which(name)
    if found:
        return found
    site = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    for candidate in sorted(site.glob(f"*/bin/{name}")) + sorted(site.glob(f"*/*/bin/{name}")):
        return str(candidate)
    return None


def tools_available():
    return all(tool(t) for t in ("ptxas", "cuobjdump", "nvdisasm"))


def assemble(ptx, cc=(9, 0)):
    """``(sass_text, ptxas -v text)`` of ``ptx`` for ``sm_<cc>``."""
    arch = f"sm_{cc[0]}{cc[1]}"
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(tool("nvdisasm")).parent), os.environ.get("PATH", "")]))
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        done = subprocess.run([tool("ptxas"), f"-arch={arch}", "-v", str(src), "-o", str(cubin)],
                              capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise RuntimeError(f"ptxas -arch={arch} failed: {done.stderr[-2000:]}")
        dump = subprocess.run([tool("cuobjdump"), "--dump-sass", str(cubin)], capture_output=True, text=True,
                              timeout=600, env=env)
        if dump.returncode:
            raise RuntimeError(f"cuobjdump --dump-sass failed: {dump.stderr[-2000:]}")
    return dump.stdout, done.stderr + done.stdout


def parse(sass):
    return [Instruction(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip())
            for m in SASS_LINE.finditer(sass)]


def main_loop(instructions):
    """The instructions of the smallest backward-branch body that holds an HMMA (empty if none)."""
    index = {ins.address: i for i, ins in enumerate(instructions)}
    best = None
    for end, ins in enumerate(instructions):
        if ins.base != "BRA":
            continue
        target = BRANCH_TARGET.search(ins.operands)
        if not target or int(target.group(1), 16) >= ins.address or int(target.group(1), 16) not in index:
            continue
        body = instructions[index[int(target.group(1), 16)]:end + 1]
        if any(i.base == "HMMA" for i in body) and (best is None or len(body) < len(best)):
            best = body
    return best or []


def loop_stats(body):
    def count(*bases):
        return sum(1 for i in body if i.base in bases)
    return LoopStats(instructions=len(body), hmma=count("HMMA"), int64_ops=sum(i.is_64bit_integer for i in body),
                     ldgsts=count("LDGSTS"), ldsm=count("LDSM"), bar=count("BAR"), branches=count("BRA"))


def access_bytes(ins):
    """Bytes one thread moves with a global load/store/atomic (``None`` for other instructions)."""
    if ins.base not in ("LDG", "STG", "ATOMG", "RED", "REDG", "LDGSTS", "ATOM"):
        return None
    mods = ins.opcode.split(".")[1:]
    for mod, size in (("128", 16), ("64", 8), ("U16", 2), ("S16", 2), ("U8", 1), ("S8", 1), ("F16x2", 4),
                      ("F32x4", 16), ("F32x2", 8)):   # REDG.E.ADD.F32x4: sm_90's vector reduction
        if mod in mods:
            return size
    return 4


def global_accesses(instructions):
    """``{(kind, bytes): count}`` of the kernel's global accesses (static), kind ``load``/``store``/``atomic``/``cp.async``
    (``atomic``: ``ATOMG``, and ``REDG``, sm_90's reduction whose result is unused, e.g. the weight gradient's adds)."""
    kinds = {"LDG": "load", "STG": "store", "ATOMG": "atomic", "RED": "atomic", "REDG": "atomic", "ATOM": "atomic",
             "LDGSTS": "cp.async"}
    found = {}
    for ins in instructions:
        size = access_bytes(ins)
        if size is not None:
            key = (kinds[ins.base], size)
            found[key] = found.get(key, 0) + 1
    return found


def registers(ptxas_text):
    found = re.search(r"Used (\d+) registers", ptxas_text)
    return int(found.group(1)) if found else 0


def static_shared(ptxas_text):
    found = re.search(r"(\d+) bytes smem", ptxas_text)
    return int(found.group(1)) if found else 0


def blocks_per_sm(regs, threads, shared_bytes, sm=SM90):
    """Resident blocks per SM on sm_90 (the occupancy calculator's rules: registers allocated per warp in
    units of 256, 1 KB of shared memory reserved per block)."""
    warps = -(-threads // 32)
    per_warp = -(-max(regs, 1) * 32 // sm["register_unit"]) * sm["register_unit"]
    by_regs = sm["registers"] // (per_warp * warps)
    by_shared = sm["shared"] // (shared_bytes + sm["shared_reserved"])
    return max(0, min(by_regs, by_shared, sm["warps"] // warps, sm["blocks"]))


@dataclass(frozen=True)
class KernelSass:
    name: str
    loop: LoopStats
    registers: int
    shared_bytes: int        # static + dynamic
    blocks_per_sm: int
    threads: int
    accesses: dict

    @property
    def occupancy(self):
        return self.blocks_per_sm * self.threads / 32 / SM90["warps"]


def budget(name):
    """Instructions per HMMA a GPU tile's main loop may take: 3.0 for the 128x128 and 128x64 tiles, 4.0 for the
    smaller ones (``None``: the simulator's tile, never run on a GPU)."""
    from .mma_tiles import GPU_TILES
    tile = next((t for t in GPU_TILES if name.endswith("_" + t.name)), None)
    if tile is None:
        return None
    return 3.0 if (tile.bm, tile.bn) in ((128, 128), (128, 64)) else 4.0


def compile_for(spec, cc=(9, 0)):
    """PTX of a ``KernelSpec`` for ``sm_<cc>`` with its exact signature (the real ``numba.cuda``, no GPU)."""
    from types import SimpleNamespace

    import numba.cuda.dispatcher as dispatcher
    from numba import cuda
    original = dispatcher.get_current_device   # device functions compile for the "current" device: say which
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)
    try:
        ptx, _ = cuda.compile_ptx(spec.pyfunc, spec.signature, cc=cc)
    finally:
        dispatcher.get_current_device = original
    return ptx


def spec_sass(spec, threads, cc=(9, 0)):
    """``KernelSass`` of any kernel ``spec`` launched with ``threads`` per block."""
    sass, info = assemble(compile_for(spec, cc), cc)
    instructions = parse(sass)
    shared = static_shared(info) + getattr(spec, "dynamic_shared_bytes", 0)
    return KernelSass(spec.name, loop_stats(main_loop(instructions)), registers(info), shared,
                      blocks_per_sm(registers(info), threads, shared), threads, global_accesses(instructions))


@functools.lru_cache(maxsize=None)
def kernel_sass(name, cc=(9, 0)):
    """``KernelSass`` of tensor-core kernel ``name`` (``mma_tiles.MMA_KERNELS``); needs the real ``numba.cuda``
    (not the simulator), ptxas and cuobjdump."""
    from .mma_kernels import all_mma_kernels
    from .mma_tiles import TILES
    tile = next(t for t in TILES if name.endswith("_" + t.name))
    return spec_sass(all_mma_kernels()[name], tile.threads, cc)


def narrow_accesses(accesses, at_most=2):
    """The entries of ``global_accesses`` that move at most ``at_most`` bytes per thread (2: one fp16 at a time):
    what a kernel with a 16-byte vector path must not contain."""
    return {key: count for key, count in accesses.items() if key[1] <= at_most}


@functools.lru_cache(maxsize=None)
def memory_kernel_sass(name, cc=(9, 0)):
    """``(KernelSass, ptxas -v text)`` of SIMT kernel ``name`` of ``registry``'s table, at its block size."""
    from .registry import THREADS, all_kernels
    spec = all_kernels()[name]
    sass, info = assemble(compile_for(spec, cc), cc)
    instructions = parse(sass)
    return KernelSass(spec.name, loop_stats(main_loop(instructions)), registers(info), static_shared(info),
                      blocks_per_sm(registers(info), THREADS, static_shared(info)), THREADS,
                      global_accesses(instructions)), info
