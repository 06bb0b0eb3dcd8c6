"""16-byte global accesses for the memory-bound kernels, and their grids sized from the SM count.

A memory-bound kernel moves 8 fp16 (or 4 fp32) per load and store where it can: ``ld.global.v4`` /
``st.global.v4`` (``_mma``'s fp16 intrinsics, and the fp32 ones below), Python twins in the simulator.
It can where the element count (or, for a per-channel kernel, the channel count) is a multiple of the
vector and every array it touches starts on a 16-byte boundary (``vectorisable``: every arena view does;
a slice of a region may not). Otherwise the launcher takes the kernel's one-element twin.

Vector kernels are named ``<kernel>_vec8`` (fp16) or ``<kernel>_vec4`` (fp32 only); the PTX tier
(``tests/cuda/test_vector_access.py``) lists them and fails when one of them compiles to a 2-byte global
access. Per-channel kernels give each thread one vector of channels for the whole launch
(``channel_lanes``): its per-channel constants are loaded once and no index is divided per element.
"""
import functools
import math
import re

from llvmlite import ir
from numba import cuda
from numba.cuda import types as nbt
from numba.cuda.extending import intrinsic

from ._mma import ld_global_v4, pack_half2, st_global_v4, unpack_half2
from .registry import SIMULATOR, THREADS
from .tape import device_span

VEC8, VEC4, VEC_BYTES = 8, 4, 16   # fp16 per vector, fp32 per vector, bytes per vector
f16, f32, i32 = nbt.float16, nbt.float32, nbt.int32
#: Resident 256-thread blocks per SM that a grid-stride kernel launches (8: 2,048 threads, a full sm_90 SM).
BLOCKS_PER_SM = 8
#: SMs assumed where no device answers (the dry run, the PTX tier): an H200's.
DEFAULT_SM_COUNT = 132


def one_element_name(name):
    """The table name of the one-element twin of kernel ``name`` (``name`` itself for one that is not a vector
    kernel): ``add_forward_vec8`` -> ``add_forward``, ``activation_forward_vec8.relu`` -> ``activation_forward.relu``.
    """
    return re.sub(r"_vec[48]\b", "", name)


@functools.lru_cache(maxsize=None)
def sm_count():
    """The current device's SM count; ``DEFAULT_SM_COUNT`` where there is none (no driver, the simulator)."""
    if SIMULATOR:
        return 1
    try:
        return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    except Exception:   # no driver or no device: the dry run and the PTX tier record without one
        return DEFAULT_SM_COUNT


def max_blocks():
    """Blocks of a grid-stride launch: enough to fill every SM (the simulator: 2, one Python thread each)."""
    return 2 if SIMULATOR else sm_count() * BLOCKS_PER_SM


def grid_vectors(n, threads=THREADS):
    """``(blocks, threads)`` for a grid-stride loop over ``n`` vectors, at most ``max_blocks()``."""
    return max(1, min(math.ceil(n / threads), max_blocks())), threads


def channel_lanes(rows, vectors_per_row, threads=THREADS):
    """``(blocks, threads)`` of a per-channel grid: at least one thread per channel vector, at most
    ``max_blocks()`` unless the row needs more; thread ``t`` owns vector ``t % vectors_per_row`` of every
    ``gridsize // vectors_per_row``-th row (the kernel's ``lanes``)."""
    need = math.ceil(rows * vectors_per_row / threads)
    least = math.ceil(vectors_per_row / threads)
    return max(1, least, min(need, max_blocks())), threads


def launch_flat(launcher, scalar, vector, width, n, arrays, *args):
    """``vector`` over ``n / width`` vectors where ``vectorisable(n, width, *arrays)``, else ``scalar`` over ``n``
    elements (both grid-stride loops taking ``args``)."""
    if vectorisable(n, width, *arrays):
        launcher.launch(vector, *grid_vectors(n // width), *args)
    else:
        launcher.launch(scalar, *grid_vectors(n), *args)


def vectorisable(count, width, *arrays):
    """Whether ``count`` (elements, or channels) is a multiple of ``width`` and every array is 16-byte aligned."""
    return count % width == 0 and all(device_span(a)[0] % VEC_BYTES == 0 for a in arrays)


# ---- fp16: 8 per access, through float32 registers (local arrays of 8, unrolled to registers) -----------------
@cuda.jit(device=True)
def load8(out, a, index):
    """``out[0:8] = float32(a[index:index + 8])`` with one 16-byte load (``index % 8 == 0``)."""
    r = ld_global_v4(a, i32(index))
    for q in range(VEC8 // 2):
        lo, hi = unpack_half2(r[q])
        out[2 * q] = f32(lo)
        out[2 * q + 1] = f32(hi)


@cuda.jit(device=True)
def store8(a, index, v):
    """``a[index:index + 8] = float16(v[0:8])`` with one 16-byte store."""
    st_global_v4(a, i32(index), pack_half2(f16(v[0]), f16(v[1])), pack_half2(f16(v[2]), f16(v[3])),
                 pack_half2(f16(v[4]), f16(v[5])), pack_half2(f16(v[6]), f16(v[7])))


# ---- fp32: 4 per access ---------------------------------------------------------------------------------------
_I64, _F32 = ir.IntType(64), ir.FloatType()


def _address(context, builder, arrty, array, index):
    data = context.make_array(arrty)(context, builder, array).data
    return builder.ptrtoint(builder.gep(data, [builder.sext(index, _I64)]), _I64)


def _asm(builder, ret, args, text, constraints):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), args)


def _global_x4_intrinsics(nb_type, ir_type, ptx_type, register):
    """The 16-byte load and store of 4 ``nb_type`` (``ld.global.v4.<ptx_type>`` / ``st``, in ``register``-class
    registers): ``ld(array, index) -> (v0, v1, v2, v3)``, ``st(array, index, v0, v1, v2, v3)``."""
    def ld(typingctx, array, index):
        sig = nbt.UniTuple(nb_type, 4)(array, nbt.int32)

        def codegen(context, builder, sig, args):
            out = _asm(builder, ir.LiteralStructType([ir_type] * 4), [_address(context, builder, sig.args[0], *args)],
                       f"{{ .reg .u64 g; cvta.to.global.u64 g, $4; ld.global.v4.{ptx_type} {{$0,$1,$2,$3}}, [g]; }}",
                       ",".join([f"={register}"] * 4 + ["l", "~{memory}"]))
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(out, k) for k in range(4)])
        return sig, codegen

    def st(typingctx, array, index, v0, v1, v2, v3):
        sig = nbt.void(array, nbt.int32, nb_type, nb_type, nb_type, nb_type)

        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [_address(context, builder, sig.args[0], args[0], args[1])] + list(args[2:]),
                 f"{{ .reg .u64 g; cvta.to.global.u64 g, $0; st.global.v4.{ptx_type} [g], {{$1,$2,$3,$4}}; }}",
                 ",".join(["l"] + [register] * 4 + ["~{memory}"]))
            return context.get_dummy_value()
        return sig, codegen

    ld.__name__, st.__name__ = f"_ld_global_{ptx_type}x4", f"_st_global_{ptx_type}x4"
    return intrinsic(ld), intrinsic(st)


_ld_global_f32x4, _st_global_f32x4 = _global_x4_intrinsics(nbt.float32, _F32, "f32", "f")
_ld_global_i32x4, _st_global_i32x4 = _global_x4_intrinsics(nbt.int32, ir.IntType(32), "b32", "r")


def _check_vector(array, index, what):
    if index % VEC4 or index < 0 or index + VEC4 > array.size:
        raise ValueError(f"{what}: element {index} of a 4-byte array of {array.size} is not the start of a "
                         f"16-byte vector inside it (index % 4 == 0 and index + 4 <= size)")


@cuda.jit(device=True)
def _ld_global_f32x4_twin(array, index):
    _check_vector(array, index, "ld.global.v4.f32")
    return f32(array[index]), f32(array[index + 1]), f32(array[index + 2]), f32(array[index + 3])


@cuda.jit(device=True)
def _st_global_f32x4_twin(array, index, v0, v1, v2, v3):
    _check_vector(array, index, "st.global.v4.f32")
    array[index], array[index + 1], array[index + 2], array[index + 3] = v0, v1, v2, v3


@cuda.jit(device=True)
def _ld_global_i32x4_twin(array, index):
    _check_vector(array, index, "ld.global.v4.b32")
    return i32(array[index]), i32(array[index + 1]), i32(array[index + 2]), i32(array[index + 3])


if SIMULATOR:
    ld_global_f32x4, st_global_f32x4 = _ld_global_f32x4_twin, _st_global_f32x4_twin
    ld_global_i32x4, st_global_i32x4 = _ld_global_i32x4_twin, _st_global_f32x4_twin   # the store twin copies any type
else:
    ld_global_f32x4, st_global_f32x4 = _ld_global_f32x4, _st_global_f32x4
    ld_global_i32x4, st_global_i32x4 = _ld_global_i32x4, _st_global_i32x4


@cuda.jit(device=True)
def load4(out, a, index):
    """``out[0:4] = a[index:index + 4]`` (fp32) with one 16-byte load (``index % 4 == 0``)."""
    v0, v1, v2, v3 = ld_global_f32x4(a, i32(index))
    out[0], out[1], out[2], out[3] = v0, v1, v2, v3


@cuda.jit(device=True)
def store4(a, index, v):
    st_global_f32x4(a, i32(index), v[0], v[1], v[2], v[3])


@cuda.jit(device=True)
def load_i32x8(out, a, index):
    """``out[0:8] = a[index:index + 8]`` (int32) with two 16-byte loads (``index % 4 == 0``)."""
    out[0], out[1], out[2], out[3] = ld_global_i32x4(a, i32(index))
    out[4], out[5], out[6], out[7] = ld_global_i32x4(a, i32(index) + VEC4)


@cuda.jit(device=True)
def store_i32x8(a, index, v):
    st_global_i32x4(a, i32(index), v[0], v[1], v[2], v[3])
    st_global_i32x4(a, i32(index) + VEC4, v[4], v[5], v[6], v[7])
