"""The SASS report: what every tensor-core kernel's main loop executes, read from compiled code (no GPU).

    python -m benchmarks.sass_report [--memory] [--only SUBSTRING] [--json PATH] [--counts PATH]

Per tensor-core kernel (``mma_tiles.MMA_KERNELS``, compiled for sm_90 with its exact signature, ``ptxas``,
``cuobjdump --dump-sass``): the main loop's static instructions per warp and k-tile, HMMAs, instructions
per HMMA against its budget (``sass.budget``), 64-bit integer halves, LDGSTS / LDSM / BAR, registers,
resident blocks and occupancy on an SM of sm_90, and the kernel's global accesses by width.
``--memory`` adds the other kernels (``registry``'s table: the memory-bound ones) with their global
accesses by width. Nothing here ran on a GPU: counts are static, occupancy is the calculator's rule.
``--counts benchmarks/gpu/sass_counts.json`` rewrites the instructions per HMMA the performance model
reads (``benchmarks/gpu/model.py``); the SASS tier fails while that file disagrees with the kernels.
Exit status 1 when a budget is exceeded.
"""
import argparse
import json
import sys

from cuda_kernels import sass


def _accesses(accesses):
    return " ".join(f"{kind}:{size}Bx{count}" for (kind, size), count in sorted(accesses.items())) or "-"


def mma_rows(only=""):
    from cuda_kernels.mma_kernels import all_mma_kernels
    return [sass.kernel_sass(name) for name in sorted(all_mma_kernels()) if only in name]


def memory_rows(only=""):
    from cuda_kernels.registry import THREADS, all_kernels
    return [sass.spec_sass(spec, THREADS) for name, spec in sorted(all_kernels().items()) if only in name]


def print_mma(rows, out=sys.stdout):
    print(f"{'kernel':52s} {'regs':>4s} {'blk/SM':>6s} {'occ':>5s} {'loop':>5s} {'HMMA':>4s} {'/HMMA':>6s} "
          f"{'budget':>6s} {'int64':>5s} {'LDGSTS':>6s} {'LDSM':>4s} {'BAR':>3s}  global accesses", file=out)
    for k in rows:
        b = sass.budget(k.name)
        flag = "" if b is None or k.loop.per_hmma <= b else " OVER"
        print(f"{k.name:52s} {k.registers:4d} {k.blocks_per_sm:6d} {k.occupancy:5.2f} {k.loop.instructions:5d} "
              f"{k.loop.hmma:4d} {k.loop.per_hmma:6.2f} {b if b else '-':>6} {k.loop.int64_ops:5d} "
              f"{k.loop.ldgsts:6d} {k.loop.ldsm:4d} {k.loop.bar:3d}  {_accesses(k.accesses)}{flag}", file=out)


def print_memory(rows, out=sys.stdout):
    print(f"\n{'kernel':52s} {'regs':>4s}  global accesses (kind:bytes x static count)", file=out)
    for k in rows:
        print(f"{k.name:52s} {k.registers:4d}  {_accesses(k.accesses)}", file=out)


def write_counts(path, rows):
    """The performance model's input: main-loop instructions per HMMA of every tensor-core kernel (sm_90)."""
    table = {k.name: round(k.loop.per_hmma, 2) for k in rows}
    with open(path, "w") as f:
        json.dump({"about": "main-loop instructions per HMMA, sm_90, ptxas + cuobjdump; written by "
                            "`python -m benchmarks.sass_report --counts PATH`; read by benchmarks/gpu/model.py",
                   "per_hmma": table}, f, indent=1, sort_keys=True)
        f.write("\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", action="store_true", help="also the memory-bound kernels' accesses by width")
    parser.add_argument("--only", default="", help="kernels whose name contains this")
    parser.add_argument("--json", help="write one JSON object per kernel to this file")
    parser.add_argument("--counts", help="write the model's table of instructions per HMMA (every kernel) here")
    args = parser.parse_args(argv)
    if not sass.tools_available():
        print("sass_report: ptxas, cuobjdump and nvdisasm are needed (CUDA toolkit, or pip install "
              "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)", file=sys.stderr)
        return 2
    rows = mma_rows(args.only)
    print("sm_90, ptxas + cuobjdump, static counts per warp and k-tile (BK 32); compiled code, not a GPU run")
    print_mma(rows)
    memory = memory_rows(args.only) if args.memory else []
    if memory:
        print_memory(memory)
    if args.counts:
        write_counts(args.counts, rows if not args.only else mma_rows())
    if args.json:
        with open(args.json, "w") as f:
            for k in rows + memory:
                f.write(json.dumps(dict(name=k.name, registers=k.registers, blocks_per_sm=k.blocks_per_sm,
                                        occupancy=k.occupancy, loop_instructions=k.loop.instructions,
                                        hmma=k.loop.hmma, per_hmma=k.loop.per_hmma if k.loop.hmma else None,
                                        int64_ops=k.loop.int64_ops, ldgsts=k.loop.ldgsts, ldsm=k.loop.ldsm,
                                        bar=k.loop.bar, budget=sass.budget(k.name),
                                        accesses={f"{kind}:{size}": n for (kind, size), n in k.accesses.items()}))
                        + "\n")
    return 1 if any(sass.budget(k.name) and k.loop.per_hmma > sass.budget(k.name) for k in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
