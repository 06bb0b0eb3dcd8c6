"""Direct NHWC convolution (forward, input and weight gradient) for the layers where im2col + GEMM loses.

im2col copies every input pixel ``KH*KW`` times to hand BLAS one big matrix; for a layer with few
input channels (the 3-channel stem: 27 columns) or a strided one (each input pixel still copied
into several patches, for a quarter of the outputs) the copy and the packing of the thin matrix
cost more than the multiply-adds. Here a block of ``PIXELS`` output pixels of one output row,
all ``Cout`` channels, stays in vector registers (`cpu_ref._simd`: output channels in the lanes)
while the kernel walks the taps and input channels: each input value is one broadcast
multiply-add per pixel and each weight vector is loaded once per block. At the borders a tap
updates only the block's pixels whose window holds it; the stride is a constant of each compiled kernel.

The input gradient (input channels in the lanes) is, with stride 1, the same forward kernel on the output
gradient with the weight turned; strided, blocks of pixels of one phase of the stride. The weight gradient
(blocks of input channels x all output channels of one tap, summed per partition of the samples) follows
the same pattern. Which layers come here is a rule of the shapes recorded in the plan
(`planner.conv_algorithm`), never a timing, so results do not depend on the machine's load. The forward
and the input gradient split their output rows between threads; each element is computed by one thread
in one fixed order, so the result does not depend on the thread count (the weight gradient's does, as
its partial sums are per partition).
"""
import functools

import numpy as np
from numba import njit, prange, uint64

from cpu_ref._epilogue import NONE, apply_rows
from cpu_ref._misc import partition, partitions, run_partitioned, run_split
from cpu_ref._simd import VECTOR_REGISTERS, vector_block
from planner.conv_algorithm import FEW_INPUT_CHANNELS, block_floats

#: Floats of every kernel's register block on numba's target (`block_floats`; `planner.conv_algorithm`'s
#: ``BLOCK_FLOATS`` and ``WIDE_BLOCK_FLOATS`` are its two values): a forward or input-gradient block holds
#: ``TARGET_BLOCK_FLOATS // channels`` pixels, a weight-gradient block as many input channels (its inner loop does
#: ``rows`` broadcast loads of ``x`` and one vector load of ``dy`` per ``rows`` multiply-adds, so a taller block does
#: more FMAs per load; AVX-512: 32->32 layers ran 1.8x faster with 8 zmm than with 4).
TARGET_BLOCK_FLOATS = block_floats(VECTOR_REGISTERS)


@functools.cache
def _kernels(cout, stride):
    """The forward's ``(span, parallel)`` for ``cout`` output channels and a stride of ``stride``, a constant of the
    compiled code (the border arithmetic's divisions by it fold away)."""
    pixels = max(1, TARGET_BLOCK_FLOATS // cout)
    alloc, zero, fma, store, load = vector_block(cout, pixels)
    s = stride

    @njit
    def span(x, wk, y, p, accumulate, ep_scale, ep_shift, ep_residual, ep_relu, ep_out, ep_scratch, t, nparts):
        """Output rows ``r = n*OH + oh`` of partition ``t``; ``wk`` is the weight as ``(KH, KW, Cin, Cout)``;
        ``accumulate``: add into what ``y`` holds (without an epilogue only). With an epilogue (``ep_*``, as
        `cpu_ref._conv._gemm_span` takes it), each output row, written to its row of ``y`` (with ``ep_scratch``,
        to the partition's first row, again and again), goes through it to ``ep_out``.

        A block is ``pixels`` consecutive output pixels of a row. Where every tap of the block is inside the
        input, a kernel row's ``KW*Cin`` (column, channel) pairs lie side by side in ``x`` and in ``wk`` alike,
        and one loop walks them; at the borders (and in a row's last, short block) each tap's loop updates only
        the pixels whose window holds it. Either way a pixel sums its taps in the same order."""
        n_, h, w, c = x.shape
        kh, kw = wk.shape[0], wk.shape[1]
        _, oh_, ow_, _ = y.shape
        xf, wf, yf = x.reshape(-1), wk.reshape(-1), y.reshape(-1)
        y2d = y.reshape(-1, cout)
        block = alloc()
        run = uint64(kw * c)
        r0, r1 = partition(n_ * oh_, t, nparts)
        for r in range(r0, r1):
            n, oh = r // oh_, r % oh_
            src = r0 if ep_scratch else r
            y_row = uint64(src * ow_ * cout)
            for ow in range(0, ow_, pixels):
                last = min(pixels, ow_ - ow)                 # the block's pixels inside the row
                for q in range(pixels):
                    if accumulate and q < last:
                        load(block, q, yf, y_row + uint64((ow + q) * cout))
                    else:
                        zero(block, q)
                inside = last == pixels and ow * s >= p and (ow + pixels - 1) * s - p + kw <= w
                for i in range(kh):
                    ih = oh * s - p + i
                    if ih < 0 or ih >= h:
                        continue
                    x_i = ((n * h + ih) * w + ow * s - p) * c       # pixel 0's tap 0 (before the row when < 0)
                    w_i = uint64(i * kw * c * cout)
                    if inside:
                        for e in range(run):
                            wi = w_i + e * uint64(cout)
                            for q in range(pixels):
                                fma(block, q, xf[uint64(x_i + q * s * c) + e], wf, wi)
                        continue
                    for j in range(kw):
                        # the pixels q whose tap j is inside the row: 0 <= (ow + q)*s - p + j < w
                        q_lo = max(0, (p - j - ow * s + s - 1) // s)
                        q_hi = min(last, (w - 1 + p - j) // s - ow + 1)
                        if q_lo >= q_hi:
                            continue
                        x_tap = x_i + j * c
                        w_tap = w_i + uint64(j * c * cout)
                        for ci in range(uint64(c)):
                            wi = w_tap + ci * uint64(cout)
                            for q in range(pixels):
                                if q_lo <= q < q_hi:
                                    fma(block, q, xf[uint64(x_tap + q * s * c) + ci], wf, wi)
                for q in range(pixels):
                    if q < last:
                        store(block, q, yf, y_row + uint64((ow + q) * cout))
            if ep_out.shape[0] > 0:
                apply_rows(y2d, src * ow_, ep_out, r * ow_, (r + 1) * ow_, ep_scale, ep_shift, ep_residual, ep_relu)

    @njit(parallel=True)
    def parallel(x, wk, y, p, accumulate, ep_scale, ep_shift, ep_residual, ep_relu, ep_out, ep_scratch, nparts):
        for t in prange(nparts):
            span(x, wk, y, p, accumulate, ep_scale, ep_shift, ep_residual, ep_relu, ep_out, ep_scratch, t, nparts)

    return span, parallel


def direct_forward(x, w, y, stride, pad, work, epilogue=NONE):
    """``y = conv2d(x, w)`` (groups 1), or with an `cpu_ref._epilogue.Epilogue`, its result in
    ``epilogue.out``; no workspace. ``work``: its size in elementwise units, for `run_split`'s choice of the
    thread pool."""
    span, parallel = _kernels(w.shape[0], stride)
    run_split(span, parallel, work, x, np.ascontiguousarray(w.transpose(1, 2, 3, 0)), y, pad, False, *epilogue)


# ---------------------------------------------------------------------------- backward: input and weight gradient

@functools.cache
def _input_grad_kernels(cin, stride):
    """The strided input gradient's ``(span, parallel)`` (`direct_input_grad`), ``stride`` a constant as in
    `_kernels`."""
    pixels = max(1, TARGET_BLOCK_FLOATS // cin)
    alloc, zero, fma, store, load = vector_block(cin, pixels)
    s = stride

    @njit
    def span(dy, wk, dx, p, accumulate, t, nparts):
        """Rows ``r = n*H + ih`` of ``dx`` in partition ``t``; ``wk`` is the weight as ``(KH, KW, Cout, Cin)``.

        Input pixel ``iw`` receives tap ``j`` from output column ``(iw + p - j) / s`` where that divides
        evenly; the pixels ``iw, iw + s, iw + 2s, ...`` of one phase ``iw % s`` share their taps and read
        consecutive output columns, so a block takes ``pixels`` of them. At the borders (and in a phase's last,
        short block) each tap's loop updates only the pixels whose column it reaches."""
        n_, h, w, c = dx.shape
        kh, kw, cout = wk.shape[0], wk.shape[1], wk.shape[2]
        _, oh_, ow_, _ = dy.shape
        dyf, wf, dxf = dy.reshape(-1), wk.reshape(-1), dx.reshape(-1)
        block = alloc()
        r0, r1 = partition(n_ * h, t, nparts)
        for r in range(r0, r1):
            n, ih = r // h, r % h
            dx_row = r * w * c
            for phase in range(min(s, w)):
                count = (w - phase + s - 1) // s                 # the phase's pixels in the row
                for b in range(0, count, pixels):
                    iw = phase + b * s
                    last = min(pixels, count - b)
                    for q in range(pixels):
                        if accumulate and q < last:
                            load(block, q, dxf, uint64(dx_row + (iw + q * s) * c))
                        else:
                            zero(block, q)
                    for i in range(kh):
                        u = ih + p - i
                        if u < 0 or u % s != 0 or u // s >= oh_:
                            continue
                        dy_row = (n * oh_ + u // s) * ow_
                        for j in range(kw):
                            v = iw + p - j
                            if v % s != 0:
                                continue
                            o = v // s                          # pixel q reads output column o + q
                            q_lo, q_hi = max(0, -o), min(last, ow_ - o)
                            if q_lo >= q_hi:
                                continue
                            dy_at = (dy_row + o) * cout
                            w_tap = uint64((i * kw + j) * cout * c)
                            if q_lo == 0 and q_hi == pixels:
                                for co in range(uint64(cout)):
                                    wi = w_tap + co * uint64(c)
                                    for q in range(pixels):
                                        fma(block, q, dyf[uint64(dy_at + q * cout) + co], wf, wi)
                            else:
                                for co in range(uint64(cout)):
                                    wi = w_tap + co * uint64(c)
                                    for q in range(pixels):
                                        if q_lo <= q < q_hi:
                                            fma(block, q, dyf[uint64(dy_at + q * cout) + co], wf, wi)
                    for q in range(pixels):
                        if q < last:
                            store(block, q, dxf, uint64(dx_row + (iw + q * s) * c))

    @njit(parallel=True)
    def parallel(dy, wk, dx, p, accumulate, nparts):
        for t in prange(nparts):
            span(dy, wk, dx, p, accumulate, t, nparts)

    return span, parallel


def _weight_grad_parallel(span):
    """The weight-gradient spans' ``parallel``: every partition's span, one thread each."""
    @njit(parallel=True)
    def parallel(x, dy, dwk_parts, s, p, nparts):
        for t in prange(nparts):
            span(x, dy, dwk_parts, s, p, t, nparts)

    return parallel


@functools.cache
def _weight_grad_kernels(cout):
    rows = max(1, TARGET_BLOCK_FLOATS // cout)
    alloc, zero, fma, store, load = vector_block(cout, rows)

    @njit
    def span(x, dy, dwk_parts, s, p, t, nparts):
        """The samples of partition ``t``: their weight gradient added into ``dwk_parts[t]``, laid out
        ``(KH, KW, Cin, Cout)``. A block is ``rows`` input channels x all output channels of one tap,
        in registers while the kernel walks one sample's output pixels (that sample's ``x`` and ``dy``
        stay in L2 across the taps); input channels after the last whole block go one at a time."""
        n_, h, w, c = x.shape
        _, oh_, ow_, _ = dy.shape
        kh, kw = dwk_parts.shape[1], dwk_parts.shape[2]
        xf, dyf, dwf = x.reshape(-1), dy.reshape(-1), dwk_parts[t].reshape(-1)
        block = alloc()
        lo, hi = partition(n_, t, nparts)
        for n in range(lo, hi):
            for i in range(kh):
                oh_lo, oh_hi = max(0, (p - i + s - 1) // s), min(oh_, (h - 1 + p - i) // s + 1)
                for j in range(kw):
                    ow_lo, ow_hi = max(0, (p - j + s - 1) // s), min(ow_, (w - 1 + p - j) // s + 1)
                    c0 = 0
                    while c0 < c:
                        done = rows if c0 + rows <= c else 1
                        dw_at = uint64(((i * kw + j) * c + c0) * cout)
                        for q in range(rows):
                            if q < done:
                                load(block, q, dwf, dw_at + uint64(q * cout))
                        for oh in range(oh_lo, oh_hi):
                            x_row = uint64(((n * h + oh * s - p + i) * w - p + j) * c + c0)
                            dy_row = uint64((n * oh_ + oh) * ow_ * cout)
                            if done == rows:
                                for ow in range(uint64(ow_lo), uint64(ow_hi)):
                                    xi, di = x_row + ow * uint64(s * c), dy_row + ow * uint64(cout)
                                    for q in range(rows):
                                        fma(block, q, xf[xi + uint64(q)], dyf, di)
                            else:
                                for ow in range(uint64(ow_lo), uint64(ow_hi)):
                                    fma(block, 0, xf[x_row + ow * uint64(s * c)], dyf, dy_row + ow * uint64(cout))
                        for q in range(rows):
                            if q < done:
                                store(block, q, dwf, dw_at + uint64(q * cout))
                        c0 += done

    return span, _weight_grad_parallel(span)


@functools.cache
def _folded_weight_grad_kernels(cout):
    rows = max(1, TARGET_BLOCK_FLOATS // cout)
    alloc, zero, fma, store, load = vector_block(cout, rows)

    @njit
    def span(x, dy, dwk_parts, s, p, t, nparts):
        """As `_weight_grad_kernels`' span, for layers with fewer input channels than a block has rows (the
        stem's 3): there a block would hold one channel, and one chain of dependent multiply-adds runs at the
        FMA's latency. But a kernel row's ``KW*Cin`` (column, channel) pairs lie side by side in an NHWC input
        row and in the ``(KH, KW, Cin, Cout)`` gradient alike, so a block takes ``rows`` consecutive pairs
        across the columns. Output columns where some of the row's taps leave the input go pair by pair."""
        n_, h, w, c = x.shape
        _, oh_, ow_, _ = dy.shape
        kh, kw = dwk_parts.shape[1], dwk_parts.shape[2]
        run = kw * c
        xf, dyf, dwf = x.reshape(-1), dy.reshape(-1), dwk_parts[t].reshape(-1)
        block = alloc()
        inner_lo = min(ow_, (p + s - 1) // s)                 # first output column with all taps inside
        inner_hi = max(inner_lo, min(ow_, (w - kw + p) // s + 1))
        lo, hi = partition(n_, t, nparts)
        for n in range(lo, hi):
            for i in range(kh):
                oh_lo, oh_hi = max(0, (p - i + s - 1) // s), min(oh_, (h - 1 + p - i) // s + 1)
                e0 = 0
                while e0 < run:
                    done = rows if e0 + rows <= run else 1
                    dw_at = uint64((i * run + e0) * cout)
                    for q in range(rows):
                        if q < done:
                            load(block, q, dwf, dw_at + uint64(q * cout))
                    for oh in range(oh_lo, oh_hi):
                        x_row = (n * h + oh * s - p + i) * w * c
                        dy_row = (n * oh_ + oh) * ow_ * cout
                        for ow in range(inner_lo, inner_hi):
                            xi, di = uint64(x_row + (ow * s - p) * c + e0), uint64(dy_row + ow * cout)
                            if done == rows:
                                for q in range(rows):
                                    fma(block, q, xf[xi + uint64(q)], dyf, di)
                            else:
                                fma(block, 0, xf[xi], dyf, di)
                        for ow in range(ow_):
                            if inner_lo <= ow < inner_hi:
                                continue
                            for q in range(rows):
                                iw = ow * s - p + (e0 + q) // c
                                if q < done and 0 <= iw < w:
                                    fma(block, q, xf[uint64(x_row + iw * c + (e0 + q) % c)], dyf,
                                        uint64(dy_row + ow * cout))
                    for q in range(rows):
                        if q < done:
                            store(block, q, dwf, dw_at + uint64(q * cout))
                    e0 += done

    return span, _weight_grad_parallel(span)


def input_grad_kernel(dy, w, dx, stride, pad, accumulate):
    """``(span, parallel, args)``: the kernel of `direct_input_grad` and its arguments before ``t, nparts``.

    With stride 1 the input gradient is the forward convolution of ``dy`` by the weight turned 180 degrees with
    its channels swapped, padded by ``KH - 1 - pad``: `_kernels`' forward, input channels in the lanes. Strided
    (or a non-square window, or padding as wide as it), `_input_grad_kernels`."""
    _, kh, kw, cin = w.shape
    if stride == 1 and kh == kw and pad < kh:
        span, parallel = _kernels(cin, 1)
        turned = np.ascontiguousarray(w[:, ::-1, ::-1, :].transpose(1, 2, 0, 3))
        return span, parallel, (dy, turned, dx, kh - 1 - pad, accumulate, *NONE)
    span, parallel = _input_grad_kernels(cin, stride)
    return span, parallel, (dy, np.ascontiguousarray(w.transpose(1, 2, 0, 3)), dx, pad, accumulate)


def direct_input_grad(dy, w, dx, stride, pad, accumulate, work):
    """``dx`` (overwritten, or added into when ``accumulate``) of a convolution (groups 1);
    no workspace. Each ``dx`` element is summed by one thread in one fixed order: the result does not
    depend on the thread count."""
    span, parallel, args = input_grad_kernel(dy, w, dx, stride, pad, accumulate)
    run_split(span, parallel, work, *args)


def direct_weight_grad(x, dy, w_shape, stride, pad, work):
    """The weight gradient ``(Cout, KH, KW, Cin)`` of a convolution (groups 1; blocks across the kernel's columns
    for fewer than ``FEW_INPUT_CHANNELS`` input channels, `_folded_weight_grad_kernels`): one partial
    sum per partition of the samples (``partitions``), added in a fixed order (reproducible for a given
    thread count)."""
    cout, kh, kw, cin = w_shape
    span, parallel = (_folded_weight_grad_kernels if cin < FEW_INPUT_CHANNELS else _weight_grad_kernels)(cout)
    parts = np.zeros((partitions(x.shape[0]), kh, kw, cin, cout), np.float32)
    run_partitioned(span, parallel, parts.shape[0], work, x, dy, parts, stride, pad)
    return parts.sum(axis=0).transpose(3, 0, 1, 2)
