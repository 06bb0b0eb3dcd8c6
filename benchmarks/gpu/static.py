"""``benchmarks.gpu.check --static``: static facts of every tensor-core kernel, no GPU needed.

One record per kernel and architecture (sm_80, sm_90): registers, spill bytes, stack bytes,
static shared memory (``ptxas -v``), the dynamic shared memory it is launched with (tiles above
48 KB) and whether both fit the architecture, mma / ldmatrix / cp.async instructions per main-loop
k-tile (one warp; the PTX holds 2 x STAGES - 1 k-tiles), and the predicted steady-state TFLOP/s
of its tile on an H200 (``model``: a prediction, not a measurement).
"""
import json
from types import SimpleNamespace

from cuda_kernels.mma_static import instruction_counts, ptxas_available, ptxas_info, shared_fits
from cuda_kernels.mma_tiles import BK, STAGES, TILES

from .model import H200, blocks_per_sm, k_tile_bounds

ARCHS = ((8, 0), (9, 0))


def _steady_tflops(name, tile, shared_bytes, gpu=H200):
    """Every SM busy with as many blocks as fit, no edge tiles: the slowest bound of one k-tile."""
    resident = blocks_per_sm(tile, shared_bytes, gpu)
    return gpu.sms * resident * 2.0 * tile.bm * tile.bn * BK / max(k_tile_bounds(name, tile, resident, gpu)) / 1e12


def static_records(archs=ARCHS):
    """The records (dicts); needs ``numba.cuda.compile_ptx`` (not the simulator) and ``ptxas``."""
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda

    from cuda_kernels.mma_kernels import all_mma_kernels
    records = []
    for cc in archs:
        # device functions compile for the "current" device: there is none, say which
        original = dispatcher.get_current_device
        dispatcher.get_current_device = lambda cc=cc: SimpleNamespace(compute_capability=cc)
        try:
            for name, spec in sorted(all_mma_kernels().items()):
                tile = next(t for t in TILES if name.endswith("_" + t.name))
                ptx, _ = cuda.compile_ptx(spec.pyfunc, spec.signature, cc=cc)
                # the k-loop body is written out for each of the STAGES stages, and for the up to STAGES - 1
                # k-tiles before it: the PTX holds 2 * STAGES - 1 k-tiles' instructions, reported per k-tile
                counts = {k: v // (2 * STAGES - 1) for k, v in instruction_counts(ptx).items()}
                info = ptxas_info(ptx, cc) if ptxas_available() else None
                record = dict(name=name, arch=f"sm_{cc[0]}{cc[1]}", tile=tile.name, threads=tile.threads,
                              mma_per_iteration_warp=counts["mma"],
                              mma_per_iteration_block=counts["mma"] * tile.threads // 32,
                              ldmatrix_per_iteration=counts["ldmatrix"] + counts["ldmatrix_trans"],
                              cp_async_per_iteration=counts["cp_async"], dynamic_shared_bytes=spec.dynamic_shared_bytes)
                if info is not None:
                    shared = info.shared_bytes + spec.dynamic_shared_bytes
                    record.update(registers=info.registers, spill_bytes=info.spill_stores + info.spill_loads,
                                  stack_bytes=info.stack_bytes, shared_bytes=info.shared_bytes,
                                  shared_fits=shared_fits(info.shared_bytes, spec.dynamic_shared_bytes, cc),
                                  predicted_tflops=round(_steady_tflops(name, tile, max(1, shared)), 1))
                records.append(record)
        finally:
            dispatcher.get_current_device = original
    return records


def static_main(json_path=None, memory=True):
    """Print the per-kernel table (and write its records to ``json_path``, one JSON object per line), then the
    SASS report (``benchmarks.sass_report``: main-loop instructions per HMMA against the budgets; with ``memory``
    the other kernels' global accesses by width); 0 when every kernel is free of spills and its shared memory
    fits."""
    records = static_records()
    if not ptxas_available():
        print("ptxas is not on PATH: instruction counts only (no registers, spills or shared bytes)")
    print(f"{'kernel':52s} {'arch':6s} {'regs':>4s} {'spill':>5s} {'smem':>6s} {'dyn':>6s} {'mma/it':>6s} "
          f"{'pred TFLOP/s':>12s}")
    for r in records:
        print(f"{r['name']:52s} {r['arch']:6s} {r.get('registers', '-'):>4} {r.get('spill_bytes', '-'):>5} "
              f"{r.get('shared_bytes', '-'):>6} {r['dynamic_shared_bytes']:>6} {r['mma_per_iteration_block']:>6} "
              f"{r.get('predicted_tflops', '-'):>12}")
    print("smem: static shared bytes (ptxas -v); dyn: dynamic shared bytes at launch (its limit raised first)")
    print("predicted TFLOP/s: steady state on an H200, a model (benchmarks/gpu/model.py), not a measurement")
    if json_path:   # JSON Lines, like every other --json of gpu_check
        with open(json_path, "w") as f:
            f.writelines(json.dumps(record) + "\n" for record in records)
    _print_sass(memory)
    return 1 if any(r.get("spill_bytes", 0) or r.get("stack_bytes", 0) or not r.get("shared_fits", True)
                    for r in records) else 0


def _print_sass(memory):
    from cuda_kernels import sass

    from benchmarks import sass_report
    if not sass.tools_available():
        print("\nSASS report skipped: ptxas, cuobjdump and nvdisasm are needed (pip install nvidia-cuda-cuobjdump "
              "nvidia-cuda-nvdisasm)")
        return
    print("\nSASS (sm_90, ptxas + cuobjdump), static counts per warp and k-tile (BK 32); compiled code, not a GPU run")
    sass_report.print_mma(sass_report.mma_rows())
    if memory:
        sass_report.print_memory(sass_report.memory_rows())
