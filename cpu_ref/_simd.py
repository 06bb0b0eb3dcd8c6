"""Vector accumulators held in registers, for numba kernels that LLVM would otherwise vectorise badly.

A direct convolution keeps a block of ``count`` output pixels x ``width`` output channels in
registers while it walks the taps and input channels. Written as plain numba loops, LLVM either
keeps that block in memory (a load and a store per multiply-add) or, once it has unrolled the
channel loop, vectorises the *input-channel* loop with gathers (numba leaves its SLP vectoriser off).
These intrinsics emit the vector operations directly: the block is one stack buffer of
``count`` vectors of ``width`` floats, read and written only at constant offsets, which LLVM's
SROA turns into vector registers; a multiply-add is one broadcast FMA (``{1to16}`` on AVX-512).
"""
import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from planner.conv_algorithm import target_vector_registers


#: Vector registers numba's target has: 32 (zmm) with AVX-512, else 16 (ymm on AVX2); the plan's rule reads the same.
VECTOR_REGISTERS = target_vector_registers()


def _block(scalar, numba_scalar, width: int, count: int):
    """What `vector_block` and `float64_sums` share, for ``count`` vectors of ``width`` ``scalar`` (an llvmlite type;
    ``numba_scalar`` the same as numba's): ``(vec, slot, alloc, zero)``, the vector type, the address of vector ``q``
    of a block, and the ``alloc()`` and ``zero(block, q)`` intrinsics."""
    vec = ir.VectorType(scalar, width)
    align = numba_scalar.bitwidth // 8

    def slot(builder, block, q):
        return builder.bitcast(builder.gep(block, [builder.mul(q, ir.Constant(q.type, width))]), vec.as_pointer())

    @intrinsic
    def alloc(typingctx):
        def codegen(context, builder, sig, args):
            return cgutils.alloca_once(builder, scalar, size=ir.Constant(ir.IntType(64), width * count))
        return types.CPointer(numba_scalar)(), codegen

    @intrinsic
    def zero(typingctx, block, q):
        def codegen(context, builder, sig, args):
            builder.store(ir.Constant(vec, None), slot(builder, *args), align=align)
            return context.get_dummy_value()
        return types.none(block, q), codegen

    return vec, slot, alloc, zero


def _element(context, builder, array_type, array, index, vector_type):
    """The address of ``array[index:index + width]`` as a ``vector_type`` pointer."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), vector_type.as_pointer())


@functools.cache
def vector_block(width: int, count: int):
    """``(alloc, zero, fma, store, load)`` for a block of ``count`` vectors of ``width`` float32:

    - ``alloc()``: the block (a float32 pointer to stack memory);
    - ``zero(block, q)``: vector ``q`` = 0;
    - ``load(block, q, y, i)``: vector ``q`` = ``y[i:i+width]`` (to add into what ``y`` holds);
    - ``fma(block, q, x, w, i)``: vector ``q`` += ``x`` * ``w[i:i+width]`` (``w`` a contiguous 1-D array);
    - ``store(block, q, y, i)``: ``y[i:i+width]`` = vector ``q``.

    ``q`` must be a compile-time constant after unrolling for the block to live in registers.
    Indices are not bounds-checked (numba's arrays are not either).
    """
    vec, slot, alloc, zero = _block(ir.FloatType(), types.float32, width, count)

    @intrinsic
    def fma(typingctx, block, q, x, w, i):
        def codegen(context, builder, sig, args):
            block_, q_, x_, w_, i_ = args
            weights = builder.load(_element(context, builder, sig.args[3], w_, i_, vec), align=4)
            splat = builder.insert_element(ir.Constant(vec, None), x_, ir.Constant(ir.IntType(32), 0))
            splat = builder.shuffle_vector(splat, ir.Constant(vec, None),
                                           ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width))
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec, vec, vec]),
                                                f"llvm.fma.v{width}f32")
            target = slot(builder, block_, q_)
            builder.store(builder.call(fn, [splat, weights, builder.load(target, align=4)]), target, align=4)
            return context.get_dummy_value()
        return types.none(block, q, types.float32, w, i), codegen

    @intrinsic
    def store(typingctx, block, q, y, i):
        def codegen(context, builder, sig, args):
            block_, q_, y_, i_ = args
            builder.store(builder.load(slot(builder, block_, q_), align=4),
                          _element(context, builder, sig.args[2], y_, i_, vec), align=4)
            return context.get_dummy_value()
        return types.none(block, q, y, i), codegen

    @intrinsic
    def load(typingctx, block, q, y, i):
        def codegen(context, builder, sig, args):
            block_, q_, y_, i_ = args
            builder.store(builder.load(_element(context, builder, sig.args[2], y_, i_, vec), align=4),
                          slot(builder, block_, q_), align=4)
            return context.get_dummy_value()
        return types.none(block, q, y, i), codegen

    return alloc, zero, fma, store, load


@functools.cache
def float64_sums(width: int, count: int):
    """``(alloc, zero, add, add_product, add_into)`` for ``count`` vectors of ``width`` float64 that sum float32
    data in registers (BatchNorm's channel sums: a sum kept in a numba array costs a load and a store per add):

    - ``alloc()``: the block (a float64 pointer to stack memory);
    - ``zero(block, q)``: vector ``q`` = 0;
    - ``add(block, q, a, i)``: vector ``q`` += ``a[i:i+width]`` widened to float64;
    - ``add_product(block, q, a, b, i)``: vector ``q`` += ``a[i:i+width] * b[i:i+width]``, the product of the
      widened values (exact: 24 + 24 significant bits fit float64's 53);
    - ``add_into(block, q, out, i)``: ``out[i:i+width]`` += vector ``q`` (``out`` a float64 array).

    As for `vector_block`: ``q`` a constant after unrolling, indices not bounds-checked.
    """
    vec, slot, alloc, zero = _block(ir.DoubleType(), types.float64, width, count)
    narrow = ir.VectorType(ir.FloatType(), width)

    def widened(context, builder, array_type, array, index):
        return builder.fpext(builder.load(_element(context, builder, array_type, array, index, narrow), align=4), vec)

    @intrinsic
    def add(typingctx, block, q, a, i):
        def codegen(context, builder, sig, args):
            block_, q_, a_, i_ = args
            target = slot(builder, block_, q_)
            value = widened(context, builder, sig.args[2], a_, i_)
            builder.store(builder.fadd(builder.load(target, align=8), value), target, align=8)
            return context.get_dummy_value()
        return types.none(block, q, a, i), codegen

    @intrinsic
    def add_product(typingctx, block, q, a, b, i):
        def codegen(context, builder, sig, args):
            block_, q_, a_, b_, i_ = args
            target = slot(builder, block_, q_)
            product = builder.fmul(widened(context, builder, sig.args[2], a_, i_),
                                   widened(context, builder, sig.args[3], b_, i_))
            builder.store(builder.fadd(builder.load(target, align=8), product), target, align=8)
            return context.get_dummy_value()
        return types.none(block, q, a, b, i), codegen

    @intrinsic
    def add_into(typingctx, block, q, out, i):
        def codegen(context, builder, sig, args):
            block_, q_, out_, i_ = args
            target = _element(context, builder, sig.args[2], out_, i_, vec)
            total = builder.fadd(builder.load(target, align=8), builder.load(slot(builder, block_, q_), align=8))
            builder.store(total, target, align=8)
            return context.get_dummy_value()
        return types.none(block, q, out, i), codegen

    return alloc, zero, add, add_product, add_into
