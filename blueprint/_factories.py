"""The DSL factories. Each validates its arguments when called and returns a frozen `Layer`.

Errors name the factory and the argument: `conv(): kernel must be a positive int, got 0`.
`blueprint._layer.layer_code` is the inverse: it prints the factory call that rebuilds a layer.
"""
from __future__ import annotations

import math
from dataclasses import fields
from numbers import Integral, Real

from blueprint._layer import (
    BlockParams, BlockStyle, BnParams, CbrParams, CbrpParams, ChannelPaddingParams,
    ConvParams, DepthwiseParams, DropoutParams, DropPathParams, FcParams, GroupConvParams, Kind, Layer,
    MbconvParams, NameParams, PoolParams, RepeatParams, SeParams, SlopeParams, CeluParams, EluParams, PreluParams,
    SoftplusParams, HardtanhParams,
)


# ---- argument checks ---------------------------------------------------------------------
#: The largest value an int argument (a width, kernel, stride, count) may take: the planner's
#: shapes, offsets and kernels index in 32/64-bit integers.
LARGEST_INT = 2**31 - 1


def _int(factory: str, name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{factory}(): {name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{factory}(): {name} must be {what}, got {value}")
    if value > LARGEST_INT:
        raise ValueError(f"{factory}(): {name} must be at most 2**31-1, got {value}")
    return int(value)


def _float(factory: str, name: str, value, low: float, high: float, high_open: bool = True,
           low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise TypeError(f"{factory}(): {name} must be a finite float, got {value!r}")
    above = low < value if low_open else low <= value
    below = value < high if high_open else value <= high
    if not (above and below):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{factory}(): {name} must be in {interval}, got {value}")
    return float(value)


def _record(factory: str, record_type, *values):
    """``record_type`` built from ``values`` (its fields in order), each checked as its field's metadata says
    (``bounded`` / ``at_least`` in ``blueprint._layer``)."""
    checked = []
    for spec, value in zip(fields(record_type), values):
        if "float" in spec.metadata:
            low, high, low_open, high_open = spec.metadata["float"]
            checked.append(_float(factory, spec.name, value, low, high, high_open, low_open))
        else:
            checked.append(_int(factory, spec.name, value, spec.metadata["int"]))
    return record_type(*checked)


def _bool(factory: str, name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{factory}(): {name} must be a bool, got {value!r}")
    return value


def _window(factory: str, kernel, stride, padding, prefix: str = "") -> tuple[int, int, int]:
    k = _int(factory, prefix + "k", kernel, 1)
    s = _int(factory, prefix + "s", stride, 1)
    p = _int(factory, prefix + "p", padding, 0)
    if p >= k:
        raise ValueError(f"{factory}(): padding {prefix}p={p} must be smaller than the kernel {prefix}k={k}")
    return k, s, p


def _layer(factory: str, name: str, value) -> Layer:
    if not isinstance(value, Layer):
        raise TypeError(f"{factory}(): {name} must be a Layer (built by a factory), "
                        f"got {type(value).__name__} {value!r}")
    return value


def _momentum_eps(factory: str, momentum, eps) -> tuple[float, float]:
    momentum = _float(factory, "momentum", momentum, 0.0, 1.0, high_open=False)
    eps = _float(factory, "eps", eps, 0.0, math.inf)
    if eps == 0.0:
        raise ValueError(f"{factory}(): eps must be > 0, got {eps}")
    return momentum, eps


# ---- composition -------------------------------------------------------------------------
def _flatten_args(factory: str, items) -> list[Layer]:
    out: list[Layer] = []
    for item in items:
        if isinstance(item, (list, tuple)):
            out.extend(_flatten_args(factory, item))
        else:
            out.append(_layer(factory, f"layer #{len(out)}", item))
    return out


def seq(*layers) -> Layer:
    """Sequential composition; nested lists/tuples of layers are flattened.

    >>> seq(conv(16, 3, 1, 1), [bn(), relu()])
    seq(conv(16, 3, 1, 1), bn(), relu())
    """
    children = _flatten_args("seq", layers)
    if not children:
        raise ValueError("seq(): needs at least one layer, got none")
    return Layer(Kind.SEQ, None, tuple(children))


def add2(lhs, rhs) -> Layer:
    """Residual sum `lhs + rhs`; `lhs` is the shortcut, `rhs` the main branch.

    >>> add2(identity(), seq(conv(16, 3, 1, 1), bn()))
    add2(identity(), seq(conv(16, 3, 1, 1), bn()))
    """
    return Layer(Kind.ADD2, None, (_layer("add2", "lhs", lhs), _layer("add2", "rhs", rhs)))


def repeat(body, times) -> Layer:
    """`times` copies of `body` in sequence (stored once).

    >>> repeat(block(16, BlockStyle.RESNET_3_3), 3)
    repeat(block(16, BlockStyle.RESNET_3_3), 3)
    """
    return Layer(Kind.REPEAT, RepeatParams(_int("repeat", "times", times, 1)), (_layer("repeat", "body", body),))


def named(name, body) -> Layer:
    """A naming scope: parameters inside are called `name.…` (torchvision-style keys).

    >>> named("layer1", seq(block(64, BlockStyle.RESNET_3_3)))
    named('layer1', seq(block(64, BlockStyle.RESNET_3_3)))
    """
    if not isinstance(name, str) or not name or not all(part.isidentifier() or part.isdigit() for part in name.split(".")):
        raise ValueError(f"named(): name must be a non-empty dotted identifier like 'layer1', got {name!r}")
    return Layer(Kind.NAMED, NameParams(name), (_layer("named", "body", body),))


def identity() -> Layer:
    """Pass-through, used as a shortcut in `add2`."""
    return Layer(Kind.IDENTITY)


# ---- convolutions ------------------------------------------------------------------------
def conv(out_ch, k, s=1, p=0) -> Layer:
    """2-D convolution, square kernel, no bias (a BN follows).

    >>> conv(64, 7, 2, 3)
    conv(64, 7, 2, 3)
    """
    out_ch = _int("conv", "out_ch", out_ch, 1)
    return Layer(Kind.CONV, ConvParams(out_ch, *_window("conv", k, s, p)))


def conv_dw(k, s=1, p=0) -> Layer:
    """Depthwise convolution: groups = channels, out channels = in channels.

    >>> conv_dw(3, 1, 1)
    conv_dw(3, 1, 1)
    """
    return Layer(Kind.CONV_DW, DepthwiseParams(*_window("conv_dw", k, s, p)))


def group_conv(out_ch, groups, k, s=1, p=0) -> Layer:
    """Grouped convolution; in and out channels must both divide by `groups`.

    >>> group_conv(64, 4, 3, 1, 1)
    group_conv(64, 4, 3, 1, 1)
    """
    out_ch = _int("group_conv", "out_ch", out_ch, 1)
    groups = _int("group_conv", "groups", groups, 1)
    if out_ch % groups:
        raise ValueError(f"group_conv(): out_ch={out_ch} must be a multiple of groups={groups}")
    return Layer(Kind.GROUP_CONV, GroupConvParams(out_ch, groups, *_window("group_conv", k, s, p)))


# ---- normalisation, activations, regularisation -----------------------------------------
def bn(momentum=0.1, eps=1e-5) -> Layer:
    """Batch norm; 2-D after a convolution, 1-D after fc/flatten/gap (decided by the planner).

    >>> bn()
    bn()
    """
    return Layer(Kind.BN, BnParams(*_momentum_eps("bn", momentum, eps)))


def relu() -> Layer:
    return Layer(Kind.RELU)


def relu6() -> Layer:
    return Layer(Kind.RELU6)


def leaky_relu(slope=0.01) -> Layer:
    """LeakyReLU with negative-side `slope` (0 <= slope < 1)."""
    return Layer(Kind.LEAKY_RELU, _record("leaky_relu", SlopeParams, slope))


def sigmoid() -> Layer:
    return Layer(Kind.SIGMOID)


def tanh() -> Layer:
    return Layer(Kind.TANH)


def silu() -> Layer:
    return Layer(Kind.SILU)


def hardswish() -> Layer:
    return Layer(Kind.HARDSWISH)


def hardsigmoid() -> Layer:
    """PyTorch's Hardsigmoid: relu6(x + 3) / 6."""
    return Layer(Kind.HARDSIGMOID)


def gelu() -> Layer:
    """GELU, exact erf form (PyTorch's default)."""
    return Layer(Kind.GELU)


def elu(alpha=1.0) -> Layer:
    """ELU: x where x > 0, else alpha * (exp(x) - 1) (`torch.nn.ELU`; alpha >= 0)."""
    return Layer(Kind.ELU, _record("elu", EluParams, alpha))


def celu(alpha=1.0) -> Layer:
    """CELU: x where x > 0, else alpha * (exp(x / alpha) - 1) (`torch.nn.CELU`; alpha > 0)."""
    return Layer(Kind.CELU, _record("celu", CeluParams, alpha))


def selu() -> Layer:
    """SELU: scale * elu(x, alpha) with PyTorch's fixed scale 1.0507... and alpha 1.6733...."""
    return Layer(Kind.SELU)


def softplus(beta=1.0, threshold=20.0) -> Layer:
    """Softplus: log(1 + exp(beta * x)) / beta, and x where beta * x > threshold (`torch.nn.Softplus`;
    beta > 0, threshold > 0)."""
    return Layer(Kind.SOFTPLUS, _record("softplus", SoftplusParams, beta, threshold))


def hardtanh(min_val=-1.0, max_val=1.0) -> Layer:
    """HardTanh: x clamped to [min_val, max_val] (`torch.nn.Hardtanh`; min_val < max_val)."""
    record = _record("hardtanh", HardtanhParams, min_val, max_val)
    if record.min_val >= record.max_val:
        raise ValueError(f"hardtanh(): min_val must be smaller than max_val, got {record.min_val} and {record.max_val}")
    return Layer(Kind.HARDTANH, record)


def mish() -> Layer:
    """Mish: x * tanh(softplus(x)) (`torch.nn.Mish`)."""
    return Layer(Kind.MISH)


def prelu(num_parameters=1) -> Layer:
    """PReLU: x where x > 0, else w * x with a learned slope `w` (initially 0.25), one shared by every channel
    (`num_parameters=1`) or one per channel (`num_parameters` = the input's channels), as `torch.nn.PReLU`;
    its parameter is `<name>.weight`."""
    return Layer(Kind.PRELU, _record("prelu", PreluParams, num_parameters))


def dropout(p) -> Layer:
    """Inverted dropout with drop probability `0 <= p < 1`.

    >>> dropout(0.2)
    dropout(0.2)
    """
    return Layer(Kind.DROPOUT, DropoutParams(_float("dropout", "p", p, 0.0, 1.0)))


def drop_path(p) -> Layer:
    """Stochastic depth (torchvision's `StochasticDepth(p, "row")`): in training each sample is
    zeroed with probability `0 <= p < 1` and kept samples are scaled by 1/(1-p); identity in eval.

    >>> drop_path(0.1)
    drop_path(0.1)
    """
    return Layer(Kind.DROP_PATH, DropPathParams(_float("drop_path", "p", p, 0.0, 1.0)))


#: what `se(gate=..., act=...)` and `mbconv(act=...)` accept (activation kind names)
SE_GATES = ("sigmoid", "hardsigmoid")
SE_ACTIVATIONS = ("relu", "silu")
MBCONV_ACTIVATIONS = ("relu6", "relu", "hardswish", "silu")


def _choice(factory: str, name: str, value, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{factory}(): {name} must be one of {', '.join(map(repr, choices))} (a str), got {value!r}")
    if value not in choices:
        raise ValueError(f"{factory}(): {name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def se(squeeze, gate="sigmoid", act="relu") -> Layer:
    """Squeeze-excitation (torchvision's `SqueezeExcitation`): global average pool, a 1x1 projection
    with bias to `squeeze` channels (`fc1`), `act`, a 1x1 projection with bias back to the input
    channels (`fc2`), `gate`, and the input multiplied channel-wise by the result. `squeeze` is a
    channel count (int) or a fraction of the input channels (float in (0, 1]: max(1, int(C * f))).

    >>> se(16, "hardsigmoid")
    se(16, 'hardsigmoid')
    """
    if isinstance(squeeze, float):
        squeeze = _float("se", "squeeze", squeeze, 0.0, 1.0, high_open=False)
        if squeeze == 0.0:
            raise ValueError("se(): a fractional squeeze must be in (0, 1], got 0.0")
    else:
        squeeze = _int("se", "squeeze", squeeze, 1)
    return Layer(Kind.SE, SeParams(squeeze, _choice("se", "gate", gate, SE_GATES),
                                   _choice("se", "act", act, SE_ACTIVATIONS)))


def flatten() -> Layer:
    """NHWC -> (N, H*W*C)."""
    return Layer(Kind.FLATTEN)


def fc(out, bias=True) -> Layer:
    """Fully connected layer; a 4-D input is flattened implicitly.

    >>> fc(10)
    fc(10)
    """
    return Layer(Kind.FC, FcParams(_int("fc", "out", out, 1), _bool("fc", "bias", bias)))


# ---- pooling -----------------------------------------------------------------------------
def maxpool(k, s, p=0) -> Layer:
    """Max pooling, square window (padding counts as -inf).

    >>> maxpool(3, 2, 1)
    maxpool(3, 2, 1)
    """
    return Layer(Kind.MAXPOOL, PoolParams(*_window("maxpool", k, s, p)))


def avgpool(k, s, p=0) -> Layer:
    """Average pooling, square window (padding counts as zeros, PyTorch's default)."""
    return Layer(Kind.AVGPOOL, PoolParams(*_window("avgpool", k, s, p)))


def gap() -> Layer:
    """Global average pooling: NHWC -> (N, C)."""
    return Layer(Kind.GAP)


def channel_padding(multiple=8) -> Layer:
    """Zero-pad the channel dimension up to a multiple of `multiple`."""
    return Layer(Kind.CHANNEL_PADDING, ChannelPaddingParams(_int("channel_padding", "multiple", multiple, 1)))


# ---- fusion-intent nodes -----------------------------------------------------------------
def cbr(out_ch, k, s, p, momentum=0.1, eps=1e-5) -> Layer:
    """Conv + BN + ReLU as one node (fused under `fuse=True`).

    >>> cbr(32, 3, 1, 1)
    cbr(32, 3, 1, 1)
    """
    out_ch = _int("cbr", "out_ch", out_ch, 1)
    k, s, p = _window("cbr", k, s, p)
    return Layer(Kind.CBR, CbrParams(out_ch, k, s, p, *_momentum_eps("cbr", momentum, eps)))


def cbrp(out_ch, conv_k, conv_s, conv_p, pool_k, pool_s, pool_p) -> Layer:
    """CBR followed by max pooling.

    >>> cbrp(32, 3, 1, 1, 2, 2, 0)
    cbrp(32, 3, 1, 1, 2, 2, 0)
    """
    out_ch = _int("cbrp", "out_ch", out_ch, 1)
    conv_window = _window("cbrp", conv_k, conv_s, conv_p, prefix="conv_")
    pool_window = _window("cbrp", pool_k, pool_s, pool_p, prefix="pool_")
    return Layer(Kind.CBRP, CbrpParams(out_ch, *conv_window, *pool_window))


def gap_fc(out, bias=True) -> Layer:
    """Global average pooling + fully connected as one node."""
    return Layer(Kind.GAP_FC, FcParams(_int("gap_fc", "out", out, 1), _bool("gap_fc", "bias", bias)))


def block(*args) -> Layer:
    """A ResNet block. `block(mid_ch, out_ch, BlockStyle.RESNET_1_3_1[_DS])` is the v1.5
    bottleneck, `block(out_ch, BlockStyle.RESNET_3_3[_DS])` the basic block. The shortcut is
    a projection (1x1 conv + BN) iff the stride is not 1 or in != out channels, else identity.

    >>> block(64, 256, BlockStyle.RESNET_1_3_1)
    block(64, 256, BlockStyle.RESNET_1_3_1)
    >>> block(128, BlockStyle.RESNET_3_3_DS)
    block(128, BlockStyle.RESNET_3_3_DS)
    """
    if not args or not isinstance(args[-1], BlockStyle):
        raise TypeError(f"block(): the last argument must be a BlockStyle, got {args!r}")
    style = args[-1]
    channels = args[:-1]
    expected = 2 if style.bottleneck else 1
    if len(channels) != expected:
        form = "block(mid_ch, out_ch, style)" if style.bottleneck else "block(out_ch, style)"
        raise TypeError(f"block(): {style!r} takes {expected} channel argument(s) as {form}, got {len(channels)}")
    if style.bottleneck:
        mid = _int("block", "mid_ch", channels[0], 1)
        out = _int("block", "out_ch", channels[1], 1)
    else:
        mid, out = None, _int("block", "out_ch", channels[0], 1)
    return Layer(Kind.BLOCK, BlockParams(mid, out, style))


def mbconv(expand_ratio, out_ch, stride, k=3, act="relu6", se=None, drop_path=0.0, expanded_ch=0,
           momentum=0.1, eps=1e-5) -> Layer:
    """Inverted residual: 1x1 expand (omitted when the expanded width equals the input's) + BN + `act`,
    k x k depthwise + BN + `act`, optional squeeze-excitation `se` (an `se(...)` layer), 1x1 project
    + BN; identity shortcut iff stride 1 and in = out, with stochastic depth `drop_path` on the
    residual branch (torchvision's MBConv: only where there is a shortcut). The expanded width is
    `expanded_ch` if given (MobileNetV3's tables), else in_channels * `expand_ratio`; every BN uses
    `momentum` and `eps`.

    Parameter names: the MobileNetV2 form (relu6, no SE, no drop path) is torchvision's MobileNetV2
    `InvertedResidual` (`conv.0.0`, ...); every other form is its MobileNetV3 / EfficientNet block
    (`block.0.0`, ..., `block.2.fc1`). With `fuse=True` only the MobileNetV2 form fuses.

    >>> mbconv(6, 24, 2)
    mbconv(6, 24, 2)
    >>> mbconv(1, 40, 2, 5, 'relu', se(32, 'hardsigmoid'), 0.0, 72, 0.01, 0.001)
    mbconv(1, 40, 2, 5, 'relu', se(32, 'hardsigmoid'), 0.0, 72, 0.01, 0.001)
    """
    ratio = _int("mbconv", "expand_ratio", expand_ratio, 1)
    out = _int("mbconv", "out_ch", out_ch, 1)
    stride = _int("mbconv", "stride", stride, 1)
    if stride not in (1, 2):
        raise ValueError(f"mbconv(): stride must be 1 or 2, got {stride}")
    kernel = _int("mbconv", "k", k, 1)
    if kernel % 2 == 0:
        raise ValueError(f"mbconv(): k must be odd (padding is (k-1)/2), got {kernel}")
    act = _choice("mbconv", "act", act, MBCONV_ACTIVATIONS)
    if se is not None and (not isinstance(se, Layer) or se.kind is not Kind.SE):
        raise TypeError(f"mbconv(): se must be None or an se(...) layer, got {se!r}")
    drop = _float("mbconv", "drop_path", drop_path, 0.0, 1.0)
    expanded = _int("mbconv", "expanded_ch", expanded_ch, 0)
    if expanded and ratio != 1:
        raise ValueError(f"mbconv(): give the expanded width either as expand_ratio ({ratio}) or as expanded_ch "
                         f"({expanded}), not both; pass expand_ratio=1 with expanded_ch")
    momentum, eps = _momentum_eps("mbconv", momentum, eps)
    return Layer(Kind.MBCONV, MbconvParams(ratio, out, stride, kernel, act, se, drop, expanded, momentum, eps))
