"""Which CPU algorithm computes each direction of a convolution: a rule of its shapes, applied when the
plan is compiled (`planner.schedule` records it in the convolution's ops as the ``conv`` attr, which
the CPU executor passes to `cpu_ref.kernels`), never a timing, so a plan runs the same arithmetic on
every run (and on every machine of the same vector width: the rule reads it, see below).

- ``depthwise`` (groups == Cin == Cout): a direct loop vectorised over channels.
- ``pointwise`` (1x1, stride 1, pad 0, groups 1): the input is the GEMM's matrix; no workspace.
- ``direct`` (`cpu_ref._conv_direct`): register-blocked NHWC loops for narrow 3x3 (and wider) layers,
  with 8, 16 or 32 channels (64 with AVX-512) in the vector lanes (output channels for the forward and the weight gradient,
  input channels for the input gradient); no workspace.
- ``winograd`` (forward and input gradient, `cpu_ref._conv_winograd`): F(2x2, 3x3) for 3x3 stride-1 padding-1
  layers of 64 to 256 channels (each side) on images that give it enough full 2x2 tiles (`winograd_pays`): 16 GEMMs
  over transformed tiles, 2.25x fewer multiply-adds than the others. The weight gradient of such a layer is an
  im2col + GEMM pass of its own (or direct).
- ``gemm``: im2col + BLAS, the wide layers. Its backward computes the weight gradient in the same pass
  as the input gradient, so a layer whose input gradient is ``gemm`` takes its weight gradient there too.

The rule reads the target's vector register count (`target_vector_registers`), as the kernels size their
register blocks by it: with AVX-512's 32 registers a block of two 64-channel pixels fits, and the direct
kernels take 64-channel layers too. This module imports nothing at import time, so the planner can use
it without numba.
"""
from __future__ import annotations

import functools
import os
from typing import NamedTuple

#: Floats of output block the direct kernels hold in registers with 16 vector registers: 8 of AVX2's ymm ...
BLOCK_FLOATS = 64
#: ... and with 32: 8 of AVX-512's zmm. Eight independent sums keep the multiply-adds' latency covered: with 4 zmm
#: (64 floats), resnet20's 32->32 layers (batch 128, one thread, Zen 4) took 6.5 ms forward and 6.3-6.6 ms input
#: gradient instead of 5.0-5.3 and 5.8; a pixel of 64 channels needs 4 zmm, so a block also holds
#: ``MIN_BLOCK_PIXELS`` of them.
WIDE_BLOCK_FLOATS = 128
#: Output pixels (input channels, for the weight gradient) a block must hold for a direct kernel to be
#: chosen: with one, every weight vector is loaded for a single pixel, and 64-channel layers ran slower
#: than im2col + GEMM.
MIN_BLOCK_PIXELS = 2
#: Fewer input channels than this (the 3-channel stem) take the direct weight gradient whose blocks run across
#: the kernel's columns (`cpu_ref._conv_direct`): resnet20's stem (batch 128, one thread) took 2.7 ms instead of
#: im2col + GEMM's 4.0 with AVX-512, 2.5 instead of 6.0 with AVX2 ...
FEW_INPUT_CHANNELS = 8
#: ... where a block holds at least this many (column, channel) pairs: resnet50's stem (64 channels, 2 pairs a
#: block with AVX-512) took 40 ms instead of GEMM's 25.
MIN_FOLDED_PAIRS = 4
#: Channels (input and output, each) of the layers whose forward is Winograd's: resnet50's 3x3 layers of 64, 128
#: and 256 channels (batch 8, 2 threads, AVX-512) took 6.6-6.8, 5.2-5.3 and 5.5 ms instead of 8.7 (direct), 9.8
#: and 9.5 (im2col + GEMM); with AVX2 and OpenBLAS's Haswell kernels 7.8, 6.2 and 6.6 instead of 8.9, 9.5 and 9.6;
#: resnet20's 64-channel layers (batch 128, 8x8) 2.3-2.4 instead of 2.9 (AVX-512, direct) and even with AVX2. At
#: 32 channels it gained little, at 16 it lost (2.7x slower), and at 512 the weight transform (16 MB written per
#: step) cost more than resnet50's 7x7 layers gain. The input gradient too, where it would be im2col + GEMM
#: (whose one pass also gave the weight gradient; that pass now gives it alone): the whole backward of a 128- and
#: a 256-channel layer (batch 32, at 16x16 and 8x8, 2 threads) took 21.9 and 25.5 ms instead of 26.8 and 28.4 with
#: AVX-512, 23.5 and 27.7 instead of 27.0 and 28.1 with AVX2; where the direct input gradient takes a layer (64
#: channels with 32 registers) it stays, faster than both.
WINOGRAD_CHANNELS = (64, 256)
#: ... and only where the image gives it work: at least this many 2x2 output tiles (over the batch; the weight
#: transform and the chunks' fixed costs are paid per call) ...: with 49-128 tiles (batch 1 at 14x14 to batch 8 at
#: 8x8, 2 threads, AVX2) the forward of 64-256 channels ran 0.83-1.23x the rule's other choice (im2col + GEMM or
#: direct) and the input gradient of 128-256 channels 0.93-1.22x; with 147-196 tiles 0.78-0.98x and 0.74-0.89x
#: (AVX-512: 0.66-0.83x and 0.69-0.83x). benchmarks/RESULTS.md has the table.
MIN_WINOGRAD_TILES = 144
#: ... whose pixels fill at least this share of their tiles (an odd size cuts the last row and column off): at 3x3
#: and 5x5 (56% and 69% filled, 288-512 tiles) 128- and 256-channel layers ran 0.86-1.04x the other choice's
#: forward and 0.96-1.05x its input gradient; at 7x7 (77%) 0.68-0.92x and 0.89-0.99x.
MIN_TILE_FILL = 0.75


class ConvAlgorithms(NamedTuple):
    """The algorithm of each direction: ``depthwise``, ``pointwise``, ``direct`` or ``gemm``; the forward and the
    input gradient may also be ``winograd``."""
    forward: str
    input_grad: str
    weight_grad: str

    def __str__(self) -> str:
        return f"fwd {self.forward}, dx {self.input_grad}, dW {self.weight_grad}"


@functools.cache
def target_vector_registers() -> int:
    """Vector registers of the CPU numba compiles for: 32 where its features (``NUMBA_CPU_FEATURES``, else the
    host's, as numba reads them) include AVX-512, else 16; 16 where llvmlite is not installed."""
    features = os.environ.get("NUMBA_CPU_FEATURES")
    if features is None:
        try:
            from llvmlite import binding
        except ImportError:
            return 16
        features = binding.get_host_cpu_features().flatten()
    return 32 if "+avx512f" in features.split(",") else 16


def block_floats(registers: int) -> int:
    """Floats of a direct kernel's register block on a target with ``registers`` vector registers:
    ``WIDE_BLOCK_FLOATS`` with 32, else ``BLOCK_FLOATS``."""
    return WIDE_BLOCK_FLOATS if registers >= 32 else BLOCK_FLOATS


def _narrow(channels: int, registers: int) -> bool:
    """Channels that fill a power-of-two number of whole 8-float vectors, and leave room for ``MIN_BLOCK_PIXELS``
    of them per block. The kernels hold a pixel's channels as one vector of ``channels`` floats, which LLVM splits
    well only at a power of two: at 24, 40, 48 and 56 channels the direct forward ran 3.4-3.7x slower than im2col +
    GEMM and the backward 3.1-4.8x (2 threads, AVX-512; at 24 with AVX2, 5.3x and 5.0x)."""
    return channels >= 8 and channels & (channels - 1) == 0 and channels * MIN_BLOCK_PIXELS <= block_floats(registers)


def _folded(cin: int, cout: int, registers: int) -> bool:
    """Few input channels, and few enough output channels for ``MIN_FOLDED_PAIRS`` pairs per weight-gradient block
    (`block_floats`, as the forward's)."""
    return cin < FEW_INPUT_CHANNELS and cout * MIN_FOLDED_PAIRS <= block_floats(registers)


def conv_algorithms(w_shape: tuple[int, int, int, int], stride: int, pad: int, groups: int,
                    image: tuple[int, int, int] | None = None, registers: int | None = None) -> ConvAlgorithms:
    """`rule` for the target's `target_vector_registers` (read only for a layer with more than 32 channels). ``image``:
    the input's ``(N, H, W)`` (the plan passes its largest variant's), which Winograd's choice reads
    (`winograd_pays`); ``None``: the weight shape alone decides, as for a large image."""
    if registers is None:
        registers = 16 if max(w_shape[0], w_shape[3]) <= BLOCK_FLOATS // MIN_BLOCK_PIXELS else target_vector_registers()
    return rule(tuple(w_shape), stride, pad, groups, registers, None if image is None else winograd_pays(*image))


def winograd_pays(n: int, h: int, w: int) -> bool:
    """Whether an input of ``n`` images of ``h x w`` gives Winograd enough full tiles (`MIN_WINOGRAD_TILES`,
    `MIN_TILE_FILL`) for a 3x3 stride-1 padding-1 layer, whose output is as large as its input."""
    tiles = n * ((h + 1) // 2) * ((w + 1) // 2)
    return tiles >= MIN_WINOGRAD_TILES and h * w >= MIN_TILE_FILL * 4 * tiles / n


@functools.cache
def rule(w_shape: tuple[int, int, int, int], stride: int, pad: int, groups: int, registers: int,
         image_pays: bool | None = None) -> ConvAlgorithms:
    """The algorithms for a convolution of OHWI weight ``w_shape`` (``Cin`` per group last) on a target with
    ``registers`` vector registers, on an input that gives Winograd enough work (``image_pays``, `winograd_pays`) or
    not (``None``: unknown, taken as enough).

    Direct forward: 8, 16 or 32 output channels, and 64 with 32 registers (resnet20's 16->16 and 32->32 stride-1
    layers, at one thread, ran 1.1-1.4x faster than im2col + GEMM; the stem and strided layers too; with
    AVX-512, 64->64 and 32->64 too). Direct input gradient: as many input channels (im2col + GEMM spends
    most of it in col2im's scatter of a ``KH*KW`` times larger patch gradient). Direct weight gradient:
    as many output channels, and either the input gradient direct too or fewer
    than ``FEW_INPUT_CHANNELS`` input channels and at most 16 output channels (32 with 32 registers), as the
    stems have (`_folded`). A stem's input gradient is not wanted; where a layer's is and runs by GEMM, that
    pass computes the weight gradient too (`cpu_ref._conv.conv2d_backward`). Winograd forward: 3x3, stride 1,
    padding 1, groups 1, ``WINOGRAD_CHANNELS`` on both sides, whatever the register count, unless the image is too
    small (``image_pays`` False); its input gradient too where it would otherwise be ``gemm`` (not where the direct
    kernel takes it). A 1x1 layer with a stride counts as a window here: im2col would first copy every
    ``stride``-th pixel (resnet20's 16->32 and 32->64 shortcuts, batch 128, 2 threads, AVX-512: forward 0.55x and
    0.88x the time of im2col + GEMM, backward 0.42x and 0.71x).
    """
    cout, kh, kw, cin = w_shape
    if groups > 1 and groups == cout and cin == 1:
        return ConvAlgorithms("depthwise", "depthwise", "depthwise")
    if kh == kw == 1 and stride == 1 and pad == 0 and groups == 1:
        return ConvAlgorithms("pointwise", "pointwise", "pointwise")
    window = groups == 1 and (kh * kw > 1 or stride > 1)
    winograd = image_pays is not False and _winograd(w_shape, stride, pad, groups)
    forward = "winograd" if winograd else "direct" if window and _narrow(cout, registers) else "gemm"
    input_grad = "direct" if window and _narrow(cin, registers) else "winograd" if winograd else "gemm"
    weight_grad = ("direct" if window and (input_grad == "direct" or _folded(cin, cout, registers))
                   and _narrow(cout, registers) else "gemm")
    return ConvAlgorithms(forward, input_grad, weight_grad)


def _winograd(w_shape: tuple[int, int, int, int], stride: int, pad: int, groups: int) -> bool:
    cout, kh, kw, cin = w_shape
    low, high = WINOGRAD_CHANNELS
    return kh == kw == 3 and stride == 1 and pad == 1 and groups == 1 and low <= cin <= high and low <= cout <= high
