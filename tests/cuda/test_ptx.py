"""Every kernel of the table compiles for sm_90 with the exact signature its launcher
passes, and contains no fp64 arithmetic (the Python-float-literal trap of CUDA-NOTES.md).

Runs WITHOUT NUMBA_ENABLE_CUDASIM (compile_ptx needs the real numba.cuda); no GPU needed.
"""
import re
from types import SimpleNamespace

import numpy as np
import pytest
from numba import cuda

from cuda_kernels.registry import H1, all_kernels, nbt

CC = (9, 0)
# An opcode with an f64 type (``add.f64``, ``fma.rn.f64``, ``cvt.f64.f32``, ``cvt.rn.f16.f64``, ...)
# at the start of an instruction, optionally predicated. Register *names* such as ``%f64``
# (the 64th fp32 register) are operands and do not match.
FP64_OPCODE = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*\.f64(?:\.[a-z0-9_]+)*)\b", re.M)
FP64_REGISTERS = re.compile(r"\.reg\s+\.f64\b")


def fp64_instructions(ptx):
    return sorted(set(FP64_OPCODE.findall(ptx))) + FP64_REGISTERS.findall(ptx)


@pytest.fixture(scope="module", autouse=True)
def device_functions_target_sm90():
    """Device functions called by a kernel are compiled for the *current* device's
    compute capability, which needs a driver; without a GPU, say sm_90."""
    if cuda.is_available():
        yield
        return
    import numba.cuda.dispatcher as dispatcher
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dispatcher, "get_current_device", lambda: SimpleNamespace(compute_capability=CC))
        yield


def _fp16_literal_trap(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = nbt.float16(nbt.float32(x[i]) * 2.5)   # 2.5 is fp64: the trap the check must catch


def _fp16_typed(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = nbt.float16(nbt.float32(x[i]) * np.float32(2.5))


def test_the_fp64_detector_sees_the_literal_trap_and_only_it():
    bad, _ = cuda.compile_ptx(_fp16_literal_trap, (H1, H1), cc=CC)
    good, _ = cuda.compile_ptx(_fp16_typed, (H1, H1), cc=CC)
    assert {"mul.f64", "cvt.f64.f32", "cvt.rn.f16.f64"} <= set(fp64_instructions(bad))
    assert fp64_instructions(good) == []


@pytest.mark.parametrize("name", sorted(all_kernels()))
def test_kernel_compiles_for_sm90_without_fp64(name):
    spec = all_kernels()[name]
    ptx, return_type = cuda.compile_ptx(spec.pyfunc, spec.signature, cc=CC)
    assert ".target sm_90" in ptx
    assert str(return_type) == "none"
    assert fp64_instructions(ptx) == [], f"{name} contains fp64 arithmetic"


def test_a_new_activation_rows_kernels_compile_without_fp64(monkeypatch):
    """The toy ``square`` row of tests/support/toy_activation.py, added to the op table only, gets two kernels
    that compile for sm_90 with the activation signatures (tests/cuda/test_activation_from_table.py runs them)."""

    from cuda_kernels import elementwise, registry
    from planner.kernel_table import activation_kernels
    from tests.support.toy_activation import SQUARE_ROW
    relu = elementwise.ACTIVATION_KERNELS["relu"]
    monkeypatch.setattr(registry, "KERNELS", {})   # a scratch table: the module's stays as it is
    toy = activation_kernels({SQUARE_ROW.prim: SQUARE_ROW}, elementwise.pointwise)[SQUARE_ROW.prim]
    for spec, like in ((toy.forward, relu.forward), (toy.backward, relu.backward)):
        assert spec.signature == like.signature
        ptx, _ = cuda.compile_ptx(spec.pyfunc, spec.signature, cc=CC)
        assert ".target sm_90" in ptx and fp64_instructions(ptx) == [], f"{spec.name} contains fp64 arithmetic"


# ---- tensor-core intrinsics (cuda_kernels._mma) ------------------------------------------------------------
from cuda_kernels._mma import (cp_async_16, cp_async_commit, cp_async_wait, ldmatrix_x4,  # noqa: E402
                               ldmatrix_x4_trans, mma_m16n8k16, shared_address)
from cuda_kernels.mma_static import instruction_counts, ptxas_available, ptxas_info  # noqa: E402

_WAIT_ALL = cp_async_wait(0)
_NO_PTXAS = "ptxas (CUDA toolkit) is not on PATH: the PTX text is checked, its assembly is not"


def _mma_probe(a, out):
    smem = cuda.shared.array(1024, nbt.float32, alignment=16)
    lane = cuda.threadIdx.x
    cp_async_16(smem, lane * 16, a, lane * 8, lane < 20)
    cp_async_commit()
    _WAIT_ALL()
    cuda.syncthreads()
    r0, r1, r2, r3 = ldmatrix_x4(smem, (lane % 16) * 32)
    t0, t1, t2, t3 = ldmatrix_x4_trans(smem, (lane % 16) * 32)
    zero = np.float32(0)
    d0, d1, d2, d3 = mma_m16n8k16(r0, r1, r2, r3, t0, t1, zero, zero, zero, zero)
    out[lane] = d0 + d1 + d2 + d3 + nbt.float32(shared_address(smem, 0))


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
def test_tensor_core_intrinsics_emit_their_ptx_and_assemble_without_spills(cc):
    ptx, _ = cuda.compile_ptx(_mma_probe, (H1, nbt.Array(nbt.float32, 1, "C")), cc=cc)
    counts = instruction_counts(ptx)
    assert counts == {"mma": 1, "ldmatrix": 1, "ldmatrix_trans": 1, "cp_async": 1}, counts
    assert "cp.async.commit_group;" in ptx and "cp.async.wait_group 0;" in ptx
    # shared operands are 32-bit shared-window addresses (%r), the global source a 64-bit pointer (%rd)
    assert re.search(r"ldmatrix[^\[]*\[%r\d+\]", ptx) and re.search(r"cp\.async\.cg\S* \[%r\d+\], \[%rd\d+\]", ptx)
    if not ptxas_available():
        pytest.skip(_NO_PTXAS)
    info = ptxas_info(ptx, cc)
    assert info.spill_stores == info.spill_loads == info.stack_bytes == 0, info
    assert 0 < info.registers <= 64 and info.shared_bytes == 4096, info


# ---- tensor-core kernels: every row of MMA_KERNELS, sm_80 and sm_90 ------------------------------------------
from cuda_kernels import mma_kernels, sass  # noqa: E402  (mma_kernels imports every tensor-core kernel module)
from cuda_kernels.mma_static import shared_fits  # noqa: E402
from cuda_kernels.mma_tiles import MMA_KERNELS, STAGES, TILES  # noqa: E402

REGISTERS_PER_SM = 65536


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)], ids=["sm80", "sm90"])
@pytest.mark.parametrize("name", sorted(mma_kernels.all_mma_kernels()))
def test_mma_kernel_assembles_with_tensor_cores_and_no_spills(name, cc):
    spec = MMA_KERNELS[name]
    tile = next(t for t in TILES if name.endswith("_" + t.name))
    ptx, _ = cuda.compile_ptx(spec.pyfunc, spec.signature, cc=cc)
    assert fp64_instructions(ptx) == [], f"{name} contains fp64 arithmetic"
    # ldmatrix / cp.async fault on addresses not 16-byte aligned; above 48 KB the pipeline is
    # dynamic shared memory (an .extern array the launch sizes)
    pipeline = re.findall(r"^\s*(\.extern |\.visible )?\.shared \.align (?:16|32|64|128) ", ptx, re.M)
    assert pipeline, "the pipeline's shared array must be 16-byte aligned"
    assert (".extern " in pipeline) == (spec.dynamic_shared_bytes > 0), (pipeline, spec.dynamic_shared_bytes)
    counts = instruction_counts(ptx)
    # the k16 steps (two per k-tile) of the main loop's body, written out for each of the STAGES pipeline stages,
    # and of the STAGES - 1 k-tiles that may run before it
    assert counts["mma"] == tile.mi * tile.ni * 2 * (2 * STAGES - 1), counts
    assert counts["ldmatrix"] + counts["ldmatrix_trans"] > 0, counts
    assert counts["cp_async"] > 0, counts
    if not ptxas_available():
        pytest.skip(_NO_PTXAS)
    info = ptxas_info(ptx, cc)
    assert info.spill_stores == info.spill_loads == info.stack_bytes == 0, info
    assert info.registers <= 255 and shared_fits(info.shared_bytes, spec.dynamic_shared_bytes, cc), info
    blocks = REGISTERS_PER_SM // (info.registers * tile.threads)
    assert blocks >= tile.design_blocks_per_sm, f"{name}: {info.registers} registers allow {blocks} blocks per SM"


def test_the_weight_gradients_vector_reduction_follows_the_target():
    """``red.global.add.v4.f32`` needs sm_90: the aligned weight gradient has it there and, compiled for sm_80 (in the
    same process, whose device functions are compiled once for sm_90), four scalar ``red.global.add.f32`` instead."""
    spec = MMA_KERNELS["mma_conv2d_backward_weight_128x128x32"]
    sm80, _ = cuda.compile_ptx(spec.pyfunc, spec.signature, cc=(8, 0))
    sm90, _ = cuda.compile_ptx(spec.pyfunc, spec.signature, cc=(9, 0))
    assert "red.global.add.v4.f32" in sm90 and "red.global.add.f32 " not in sm90
    assert "red.global.add.v4.f32" not in sm80 and sm80.count("red.global.add.f32 ") == 4 * sm90.count(
        "red.global.add.v4.f32")


def test_gpu_check_static_writes_one_record_per_kernel_and_architecture(monkeypatch, tmp_path, capsys):
    """``python -m benchmarks.gpu.check --static`` (item 5 of issue 12) on one kernel, the 128x128 input gradient (dynamic shared
    memory): its printed row and JSON Lines records carry what the PTX tier checks above."""
    import json
    from benchmarks.gpu.static import static_main
    name, tile = "mma_conv2d_backward_data_128x128x32", TILES[0]
    monkeypatch.setattr(mma_kernels, "all_mma_kernels", lambda: {name: MMA_KERNELS[name]})
    out = tmp_path / "static.jsonl"
    assert static_main(str(out), memory=False) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["name"], r["arch"]) for r in records] == [(name, "sm_80"), (name, "sm_90")]
    for r in records:
        assert r["mma_per_iteration_warp"] == tile.mi * tile.ni * 2 and r["mma_per_iteration_block"] == 8 * 32
        assert r["dynamic_shared_bytes"] == MMA_KERNELS[name].dynamic_shared_bytes > 48 * 1024
    printed = capsys.readouterr().out
    assert printed.count(name) == 2 + sass.tools_available() and "not a measurement" in printed   # + its SASS row
    if not ptxas_available():
        pytest.skip(_NO_PTXAS)
    for r in records:
        assert 0 < r["registers"] <= 255 and r["spill_bytes"] == r["stack_bytes"] == 0 and r["shared_fits"], r
        assert 0 < r["predicted_tflops"] < 989, r


# ---- depthwise kernels: 8 channels per thread in 16-byte vectors (cuda_kernels._depthwise) -------------------
DEPTHWISE_VECTORS = {  # kernel: (16-byte loads, 16-byte stores) it must contain, per PTX instruction
    "depthwise_forward_vec8": ({"ld.global.nc.v4.b32"}, {"st.global.v4.b32"}),
    "depthwise_backward_data_vec8": ({"ld.global.nc.v4.b32", "ld.global.v4.b32"}, {"st.global.v4.b32"}),
    "depthwise_backward_weight_vec8": ({"ld.global.nc.v4.b32"}, set()),   # fp32 atomics out
}
GLOBAL_ACCESS = re.compile(r"(?<![.\w])((?:ld|st)\.global[.a-z0-9]*)\s")   # inline asm sits mid-line


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)], ids=["sm80", "sm90"])
@pytest.mark.parametrize("name", sorted(DEPTHWISE_VECTORS))
def test_depthwise_vector_kernels_move_activations_in_16_byte_vectors(name, cc):
    spec = all_kernels()[name]
    ptx, _ = cuda.compile_ptx(spec.pyfunc, spec.signature, cc=cc)
    loads, stores = DEPTHWISE_VECTORS[name]
    accesses = set(GLOBAL_ACCESS.findall(ptx))
    assert loads | stores <= accesses, f"{name}: global accesses {sorted(accesses)}"
    # activations never move 2 bytes at a time: the only scalar global loads are the weights' (u16, read once
    # per tap) and no fp16 is stored alone
    assert not {a for a in accesses if a.startswith("st.global") and ".v4" not in a}, sorted(accesses)
    if not ptxas_available():
        pytest.skip(_NO_PTXAS)
    info = ptxas_info(ptx, cc)
    assert info.spill_stores == info.spill_loads == info.stack_bytes == 0, info


# ---- compile time is visible to fit(): KernelSpec.compile fires numba's compile event ------------------
class _StandInDispatcher:
    """What KernelSpec.compile uses of numba-cuda's CUDADispatcher (no GPU here to compile for)."""

    def __init__(self):
        self.overloads, self.compiled = {}, []

    def compile(self, signature):
        self.compiled.append(tuple(signature))
        self.overloads[tuple(signature)] = object()


def test_a_cuda_compile_is_seen_by_fits_compile_watch_once_per_signature():
    from blueprint.task._console import CompileWatch
    from cuda_kernels.registry import KernelSpec
    from cuda_kernels.tape import LaunchTape
    spec = KernelSpec("stand_in", None, _StandInDispatcher(), (H1,), ("x",))
    tape = LaunchTape()
    tape._entries += [SimpleNamespace(kind="kernel", spec=spec), SimpleNamespace(kind="upload"),
                      SimpleNamespace(kind="kernel", spec=spec)]
    notices = []
    with CompileWatch(on_first_compile=lambda: notices.append("notice")) as watch:
        tape.compile_kernels()
        tape.compile_kernels()        # in memory now: no second compile, no second event
    assert spec.kernel.compiled == [(H1,)] and notices == ["notice"] and watch.compiled and watch.seconds > 0
