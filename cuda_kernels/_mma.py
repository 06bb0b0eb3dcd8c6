"""Tensor-core primitives as numba intrinsics: inline PTX through llvmlite ``ir.InlineAsm``.

numba-cuda 0.30 has no wmma/mma API; each function here emits one PTX instruction (sm_80+).
Under ``NUMBA_ENABLE_CUDASIM=1`` the same names are the Python twins of ``_mma_twins``,
with the instructions' per-lane semantics, so the kernels built on them run in the simulator.

Conventions: a ``b32`` register holding two fp16 is a ``uint32`` (low half = lower index);
shared memory is addressed as ``(smem, byte_offset)`` with ``smem`` any 1-D shared array
(the kernels use one float32 array for the whole pipeline and reuse it in the epilogue);
global memory as ``(array, element_index)``.

``mma_m16n8k16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)``
    ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``: D(16x8 f32) = A(16x16 f16) @ B(16x8 f16) + C.
    Fragments (PTX ISA "Matrix fragments for mma.m16n8k16", g = lane >> 2, t = lane % 4):
    a0 = A[g, 2t:2t+2], a1 = A[g+8, 2t:2t+2], a2 = A[g, 2t+8:2t+10], a3 = A[g+8, 2t+8:2t+10];
    b0 = B[2t:2t+2, g], b1 = B[2t+8:2t+10, g];
    c0/d0 = C[g, 2t], c1 = C[g, 2t+1], c2 = C[g+8, 2t], c3 = C[g+8, 2t+1].

``ldmatrix_x4(smem, byte_offset) -> (r0, r1, r2, r3)``, ``ldmatrix_x4_trans`` (same, ``.trans``)
    ``ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16``: four 8x8 b16 matrices; lanes 8i..8i+7
    give the (16-byte aligned) addresses of the 8 rows of matrix i. Lane l receives in ``ri``
    M_i[l >> 2, 2(l % 4) : 2(l % 4) + 2] (``.trans``: M_i[2(l % 4), l >> 2] and M_i[2(l % 4) + 1, l >> 2]).
    With M_i the row-major 8x8 blocks of an operand tile this yields the A / B fragments above.

``cp_async_16(smem, byte_offset, src, index, valid)``, ``cp_async_commit()``, ``cp_async_wait(n)``
    ``cp.async.cg.shared.global [dst], [src + 2 index], 16, valid ? 16 : 0``: an asynchronous 16-byte
    copy (zero-filled when ``valid`` is 0, the padding of a convolution; ``src`` must still be a
    valid pointer; ``cp_async_16_at`` drops that, see it); ``cp.async.commit_group`` closes a group;
    ``cp_async_wait(n)`` returns the device function ``cp.async.wait_group n`` (the copies of all but the newest ``n`` committed
    groups are visible to this thread; a ``syncthreads`` makes them visible to the block).

``cp_async_16_from(smem, window, byte_offset, src, row, plus, valid)``: ``cp_async_16_at`` of element ``row + plus``,
the address ``&src[row]`` plus ``plus`` elements added in 64 bits (``row`` fixed along the main loop, ``plus`` moving).

``shared_address(smem, byte_offset) -> uint32``: the 32-bit shared-window address (``cvta.to.shared``).

``pack_half2(lo, hi) -> uint32``: two fp16 in one b32, ``lo`` in bits 0-15.

``st_shared_b32(smem, byte_offset, r)`` (``st.shared.b32``, 4-byte aligned) and ``ld_shared_v4(smem, byte_offset) -> (r0..r3)``
(``ld.shared.v4.b32``, 16-byte aligned): the epilogues stage an fp16 tile through shared memory as fp16 pairs and
read it back in 16-byte chunks for ``st_global_v4``.

``ld_global_v4(array, index) -> (r0, r1, r2, r3)``, ``ld_global_nc_v4``, ``st_global_v4(array, index, r0..r3)``
    ``ld.global[.nc].v4.b32`` / ``st.global.v4.b32`` of the 16 bytes from element ``index`` of a 1-D
    fp16 array (``index % 8 == 0`` and a 16-byte aligned array: 8 fp16, ``r0`` holding elements 0-1).
    ``.nc`` (the read-only data path): only for arrays no thread of the kernel writes. The depthwise
    kernels' 8-channel vectors.
``unpack_half2(reg) -> (lo, hi)``: the two fp16 of a ``b32`` register (inverse of ``pack_half2``).

``red_add_v4(array, index, v0, v1, v2, v3)``
    ``red.global.add.v4.f32``: adds four fp32 to elements ``index .. index + 3`` of a 1-D fp32 array (``index % 4
    == 0``, a 16-byte aligned array) in one 16-byte reduction (sm_90+, PTX ISA 8.1); compiled for an older target
    (sm_80) it is four ``red.global.add.f32``. The weight gradient's epilogue.
``swap_pair(v0, v1) -> (w0, w1)``: lane ``l``'s two fp32 as lane ``l ^ 1`` gave them (``shfl.sync.bfly`` of the full
warp, every lane taking part).
``warp_uniform(value) -> int32``: lane 0's ``value`` (``shfl.sync.idx`` of the full warp) for a value every lane
already holds: ptxas then knows it is warp-uniform (a loop counted by it needs no ``WARPSYNC``).
"""
from llvmlite import ir
from numba import cuda
from numba.cuda import types as nbt
from numba.cuda.extending import intrinsic

from .registry import SIMULATOR

_I8, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
_SHARED = 3   # NVPTX address space of shared memory

MMA_PTX = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
LDMATRIX_PTX = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
LDMATRIX_TRANS_PTX = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
CP_ASYNC_PTX = "cp.async.cg.shared.global"


def _asm(builder, out_types, in_values, text, constraints):
    """Call one inline-asm statement (volatile: never moved or merged) and return its outputs."""
    ret = (ir.VoidType() if not out_types else out_types[0] if len(out_types) == 1
           else ir.LiteralStructType(out_types))
    fnty = ir.FunctionType(ret, [v.type for v in in_values])
    result = builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), in_values)
    if len(out_types) > 1:
        return [builder.extract_value(result, i) for i in range(len(out_types))]
    return [result] if out_types else []


def _shared_window_of(context, builder, arrty, array, byte_offset):
    data = context.make_array(arrty)(context, builder, array).data
    byte_ptr = builder.gep(builder.bitcast(data, _I8.as_pointer()), [byte_offset])
    return builder.ptrtoint(builder.addrspacecast(byte_ptr, _I8.as_pointer(_SHARED)), _I32)


@intrinsic
def shared_address(typingctx, smem, byte_offset):
    def codegen(context, builder, sig, args):
        return _shared_window_of(context, builder, sig.args[0], args[0], args[1])
    return nbt.uint32(smem, nbt.int32), codegen


@intrinsic
def _mma_m16n8k16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    sig = nbt.UniTuple(nbt.float32, 4)(*([nbt.uint32] * 6 + [nbt.float32] * 4))

    def codegen(context, builder, sig, args):
        d = _asm(builder, [_F32] * 4, list(args),
                 MMA_PTX + " {$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                 "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
        return context.make_tuple(builder, sig.return_type, d)
    return sig, codegen


def _make_ldmatrix(ptx):
    @intrinsic
    def load(typingctx, smem, byte_offset):
        sig = nbt.UniTuple(nbt.uint32, 4)(smem, nbt.int32)

        def codegen(context, builder, sig, args):
            address = _shared_window_of(context, builder, sig.args[0], args[0], args[1])
            r = _asm(builder, [_I32] * 4, [address], ptx + " {$0,$1,$2,$3}, [$4];", "=r,=r,=r,=r,r,~{memory}")
            return context.make_tuple(builder, sig.return_type, r)
        return sig, codegen
    return load


def _emit_cp_async_16(builder, dst, gptr, valid):
    """The ``cp.async`` of 16 bytes from global address ``gptr`` (i64) to shared address ``dst`` (i32); where
    ``valid`` (i1) is false it reads no byte (src-size 0) and zero-fills."""
    src_bytes = builder.select(valid, ir.Constant(_I32, 16), ir.Constant(_I32, 0))
    _asm(builder, [], [dst, gptr, src_bytes], CP_ASYNC_PTX + " [$0], [$1], 16, $2;", "r,l,r,~{memory}")


@intrinsic
def _cp_async_16(typingctx, smem, byte_offset, src, index, valid):
    sig = nbt.void(smem, nbt.int32, src, nbt.int32, nbt.int32)

    def codegen(context, builder, sig, args):
        dst = _shared_window_of(context, builder, sig.args[0], args[0], args[1])
        data = context.make_array(sig.args[2])(context, builder, args[2]).data
        gptr = builder.ptrtoint(builder.gep(data, [builder.sext(args[3], _I64)]), _I64)
        _emit_cp_async_16(builder, dst, gptr, builder.icmp_signed("!=", args[4], ir.Constant(_I32, 0)))
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _cp_async_commit(typingctx):
    def codegen(context, builder, sig, args):
        _asm(builder, [], [], "cp.async.commit_group;", "~{memory}")
        return context.get_dummy_value()
    return nbt.void(), codegen


def _cp_async_wait(pending):
    @intrinsic
    def wait_group(typingctx):
        def codegen(context, builder, sig, args):
            _asm(builder, [], [], f"cp.async.wait_group {int(pending)};", "~{memory}")
            return context.get_dummy_value()
        return nbt.void(), codegen
    return wait_group


@intrinsic
def _pack_half2(typingctx, lo, hi):
    def codegen(context, builder, sig, args):
        i16 = ir.IntType(16)
        low = builder.zext(builder.bitcast(args[0], i16), _I32)
        high = builder.zext(builder.bitcast(args[1], i16), _I32)
        return builder.or_(low, builder.shl(high, ir.Constant(_I32, 16)))
    return nbt.uint32(nbt.float16, nbt.float16), codegen


@intrinsic
def _st_shared_b32(typingctx, smem, byte_offset, r):
    sig = nbt.void(smem, nbt.int32, nbt.uint32)

    def codegen(context, builder, sig, args):
        address = _shared_window_of(context, builder, sig.args[0], args[0], args[1])
        _asm(builder, [], [address, args[2]], "st.shared.b32 [$0], $1;", "r,r,~{memory}")
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _ld_shared_v4(typingctx, smem, byte_offset):
    sig = nbt.UniTuple(nbt.uint32, 4)(smem, nbt.int32)

    def codegen(context, builder, sig, args):
        address = _shared_window_of(context, builder, sig.args[0], args[0], args[1])
        r = _asm(builder, [_I32] * 4, [address], "ld.shared.v4.b32 {$0,$1,$2,$3}, [$4];", "=r,=r,=r,=r,r,~{memory}")
        return context.make_tuple(builder, sig.return_type, r)
    return sig, codegen


LD_GLOBAL_V4_PTX = "ld.global.v4.b32"
LD_GLOBAL_NC_V4_PTX = "ld.global.nc.v4.b32"
ST_GLOBAL_V4_PTX = "st.global.v4.b32"


def _global_address(context, builder, arrty, array, index):
    data = context.make_array(arrty)(context, builder, array).data
    return builder.ptrtoint(builder.gep(data, [builder.sext(index, _I64)]), _I64)


def _make_ld_global_v4(ptx):
    @intrinsic
    def load(typingctx, array, index):
        sig = nbt.UniTuple(nbt.uint32, 4)(array, nbt.int32)

        def codegen(context, builder, sig, args):
            address = _global_address(context, builder, sig.args[0], args[0], args[1])
            r = _asm(builder, [_I32] * 4, [address],
                     "{ .reg .u64 g; cvta.to.global.u64 g, $4; " + ptx + " {$0,$1,$2,$3}, [g]; }",
                     "=r,=r,=r,=r,l,~{memory}")
            return context.make_tuple(builder, sig.return_type, r)
        return sig, codegen
    return load


@intrinsic
def _st_global_v4(typingctx, array, index, r0, r1, r2, r3):
    sig = nbt.void(array, nbt.int32, nbt.uint32, nbt.uint32, nbt.uint32, nbt.uint32)

    def codegen(context, builder, sig, args):
        address = _global_address(context, builder, sig.args[0], args[0], args[1])
        _asm(builder, [], [address] + list(args[2:]),
             "{ .reg .u64 g; cvta.to.global.u64 g, $0; " + ST_GLOBAL_V4_PTX + " [g], {$1,$2,$3,$4}; }",
             "l,r,r,r,r,~{memory}")
        return context.get_dummy_value()
    return sig, codegen


RED_V4_PTX = "red.global.add.v4.f32"
RED_V4_CC = (9, 0)   # vector red: sm_90 and PTX ISA 8.1


@intrinsic
def _red_add_v4(typingctx, array, index, v0, v1, v2, v3):
    """The target's compute capability is read while the calling kernel is lowered (numba's own ``tanh`` does the
    same): one kernel body, compiled per target."""
    sig = nbt.void(array, nbt.int32, nbt.float32, nbt.float32, nbt.float32, nbt.float32)

    def codegen(context, builder, sig, args):
        from numba.cuda.core import targetconfig
        address = _global_address(context, builder, sig.args[0], args[0], args[1])
        if tuple(targetconfig.ConfigStack().top().compute_capability) >= RED_V4_CC:
            red = RED_V4_PTX + " [g], {$1,$2,$3,$4};"
        else:
            red = " ".join(f"red.global.add.f32 [g+{4 * j}], ${j + 1};" for j in range(4))
        _asm(builder, [], [address] + list(args[2:]), "{ .reg .u64 g; cvta.to.global.u64 g, $0; " + red + " }",
             "l,f,f,f,f,~{memory}")
        return context.get_dummy_value()
    return sig, codegen


@cuda.jit(device=True)
def _swap_pair(v0, v1):
    return cuda.shfl_xor_sync(0xFFFFFFFF, v0, 1), cuda.shfl_xor_sync(0xFFFFFFFF, v1, 1)


@intrinsic
def _unpack_half2(typingctx, reg):
    sig = nbt.UniTuple(nbt.float16, 2)(nbt.uint32)

    def codegen(context, builder, sig, args):
        i16 = ir.IntType(16)   # numba's data model of float16: its bits in an i16
        lo = builder.trunc(args[0], i16)
        hi = builder.trunc(builder.lshr(args[0], ir.Constant(_I32, 16)), i16)
        return context.make_tuple(builder, sig.return_type, [lo, hi])
    return sig, codegen


# The ``_at`` forms take the shared window address of byte 0 (``shared_window``, computed once per kernel) and
# an int32 byte offset: the address is then one 32-bit add that ptxas folds into the instruction's immediate.
@intrinsic
def _shared_window(typingctx, smem):
    def codegen(context, builder, sig, args):
        return _shared_window_of(context, builder, sig.args[0], args[0], ir.Constant(_I32, 0))
    return nbt.uint32(smem), codegen


def _make_ldmatrix_at(ptx):
    @intrinsic
    def load(typingctx, smem, window, byte_offset):
        sig = nbt.UniTuple(nbt.uint32, 4)(smem, nbt.uint32, nbt.int32)

        def codegen(context, builder, sig, args):
            r = _asm(builder, [_I32] * 4, [builder.add(args[1], args[2])], ptx + " {$0,$1,$2,$3}, [$4];",
                     "=r,=r,=r,=r,r,~{memory}")
            return context.make_tuple(builder, sig.return_type, r)
        return sig, codegen
    return load


@intrinsic
def _cp_async_16_at(typingctx, smem, window, byte_offset, src, index, valid):
    """``cp_async_16`` at ``window + byte_offset``. Where ``valid`` is 0 the copy reads
    no byte (src-size 0): its address is not clamped to a valid one (one instruction per copy less in the main
    loops). CUTLASS's implicit-GEMM iterators rely on the same (``cp_async_zfill`` of the padding's out-of-tensor
    addresses, e.g. ``conv2d_fprop_activation_tile_access_iterator_analytic.h``); not yet run here on a GPU."""
    sig = nbt.void(smem, nbt.uint32, nbt.int32, src, nbt.int32, nbt.boolean)

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[3])(context, builder, args[3]).data
        gptr = builder.ptrtoint(builder.gep(data, [builder.sext(args[4], _I64)]), _I64)
        _emit_cp_async_16(builder, builder.add(args[1], args[2]), gptr, args[5])
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _cp_async_16_at_plus(typingctx, smem, window, byte_offset, src, index, plus, valid):
    """``cp_async_16_at`` of element ``index + plus``, ``plus`` a constant after unrolling: the address is
    ``&src[index]`` with a constant byte offset (an immediate of the ``LDGSTS``), so that one thread's chunks of one
    row share a single address computation."""
    sig = nbt.void(smem, nbt.uint32, nbt.int32, src, nbt.int32, nbt.int32, nbt.boolean)

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[3])(context, builder, args[3]).data
        row = builder.gep(data, [builder.sext(args[4], _I64)])
        gptr = builder.ptrtoint(builder.gep(row, [builder.sext(args[5], _I64)]), _I64)
        _emit_cp_async_16(builder, builder.add(args[1], args[2]), gptr, args[6])
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _opaque_i32(typingctx, value):
    """``value`` through a ``mov`` LLVM cannot see into (an int32 it then neither widens nor shares across uses)."""
    sig = nbt.int32(nbt.int32)

    def codegen(context, builder, sig, args):
        return _asm(builder, [_I32], [args[0]], "mov.b32 $0, $1;", "=r,r")[0]
    return sig, codegen


@intrinsic
def _cp_async_16_from(typingctx, smem, window, byte_offset, src, row, plus, valid):
    """``cp_async_16_at`` of element ``row + plus``, the address ``&src[row]`` plus ``plus`` elements added as 64-bit
    integers (a second ``gep`` would be merged back into one of ``row + plus``): where ``row`` does not change along
    the main loop (and ``plus`` does), ``&src[row]`` is computed once, before it, and each copy's address is one
    ``IMAD.WIDE`` (the 32-bit index sum ``row + plus`` costs an add before it). Exact where ``row + plus``, the copied
    element, is in the array."""
    sig = nbt.void(smem, nbt.uint32, nbt.int32, src, nbt.int32, nbt.int32, nbt.boolean)

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[3])(context, builder, args[3]).data
        base = builder.ptrtoint(builder.gep(data, [builder.sext(args[4], _I64)]), _I64)
        size = context.get_abi_sizeof(context.get_data_type(sig.args[3].dtype))
        gptr = builder.add(base, builder.mul(builder.sext(args[5], _I64), ir.Constant(_I64, size)))
        _emit_cp_async_16(builder, builder.add(args[1], args[2]), gptr, args[6])
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _warp_uniform(typingctx, value):
    """``value`` of lane 0, every lane of the warp taking part (see the module docstring)."""
    sig = nbt.int32(nbt.int32)

    def codegen(context, builder, sig, args):
        return _asm(builder, [_I32], [args[0]], "shfl.sync.idx.b32 $0, $1, 0, 0x1f, 0xffffffff;", "=r,r")[0]
    return sig, codegen


def _opaque_i32_twin(value):
    return value


def _window_zero(smem):
    return 0


def _cp_async_16_from_twin(smem, window, byte_offset, src, row, plus, valid):
    cp_async_16(smem, byte_offset, src, row + plus if valid else 0, valid)


def _ldmatrix_x4_at_twin(smem, window, byte_offset):
    return ldmatrix_x4(smem, byte_offset)


def _ldmatrix_x4_trans_at_twin(smem, window, byte_offset):
    return ldmatrix_x4_trans(smem, byte_offset)


def _cp_async_16_at_twin(smem, window, byte_offset, src, index, valid):
    cp_async_16(smem, byte_offset, src, index if valid else 0, valid)


def _cp_async_16_at_plus_twin(smem, window, byte_offset, src, index, plus, valid):
    cp_async_16(smem, byte_offset, src, index + plus if valid else 0, valid)


if SIMULATOR:
    from ._mma_twins import (cp_async_16, cp_async_commit, cp_async_wait, ld_global_v4,  # noqa: F401
                             ld_global_v4 as ld_global_nc_v4, ldmatrix_x4, ldmatrix_x4_trans, mma_m16n8k16,
                             ld_shared_v4, pack_half2_device as pack_half2, st_global_v4, st_shared_b32,
                             unpack_half2_device as unpack_half2, red_add_v4, swap_pair)
else:
    red_add_v4, swap_pair = _red_add_v4, _swap_pair
    pack_half2 = _pack_half2
    st_shared_b32, ld_shared_v4 = _st_shared_b32, _ld_shared_v4
    ld_global_v4, ld_global_nc_v4 = _make_ld_global_v4(LD_GLOBAL_V4_PTX), _make_ld_global_v4(LD_GLOBAL_NC_V4_PTX)
    st_global_v4, unpack_half2 = _st_global_v4, _unpack_half2
    mma_m16n8k16 = _mma_m16n8k16
    ldmatrix_x4 = _make_ldmatrix(LDMATRIX_PTX)
    ldmatrix_x4_trans = _make_ldmatrix(LDMATRIX_TRANS_PTX)
    cp_async_16, cp_async_commit, cp_async_wait = _cp_async_16, _cp_async_commit, _cp_async_wait
if SIMULATOR:   # the simulator runs device functions as Python: the twins, the window unused
    shared_window, cp_async_16_at, cp_async_16_at_plus = _window_zero, _cp_async_16_at_twin, _cp_async_16_at_plus_twin
    cp_async_16_from = _cp_async_16_from_twin
    opaque_i32 = warp_uniform = _opaque_i32_twin
    ldmatrix_x4_at, ldmatrix_x4_trans_at = _ldmatrix_x4_at_twin, _ldmatrix_x4_trans_at_twin
else:
    shared_window, cp_async_16_at, cp_async_16_at_plus = _shared_window, _cp_async_16_at, _cp_async_16_at_plus
    cp_async_16_from = _cp_async_16_from
    opaque_i32, warp_uniform = _opaque_i32, _warp_uniform
    ldmatrix_x4_at, ldmatrix_x4_trans_at = _make_ldmatrix_at(LDMATRIX_PTX), _make_ldmatrix_at(LDMATRIX_TRANS_PTX)
