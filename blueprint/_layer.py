"""The frozen values a network is written in: `Kind`, parameter records, `Layer`, `BluePrint`.

A `Layer` is a kind, a frozen parameter record and a tuple of child layers. Nothing here
is ever mutated: equality and hashing are structural, and `repr()` is DSL code that
evaluates back to an equal value (see `blueprint._factories` for the code each kind prints).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Iterator


class Kind(enum.Enum):
    SEQ = "seq"
    ADD2 = "add2"
    REPEAT = "repeat"
    NAMED = "named"
    IDENTITY = "identity"
    CONV = "conv"
    CONV_DW = "conv_dw"
    GROUP_CONV = "group_conv"
    BN = "bn"
    RELU = "relu"
    RELU6 = "relu6"
    LEAKY_RELU = "leaky_relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    SILU = "silu"
    HARDSWISH = "hardswish"
    GELU = "gelu"
    DROPOUT = "dropout"
    FLATTEN = "flatten"
    FC = "fc"
    MAXPOOL = "maxpool"
    AVGPOOL = "avgpool"
    GAP = "gap"
    CHANNEL_PADDING = "channel_padding"
    CBR = "cbr"
    CBRP = "cbrp"
    GAP_FC = "gap_fc"
    BLOCK = "block"
    MBCONV = "mbconv"


ACTIVATIONS = frozenset({Kind.RELU, Kind.RELU6, Kind.LEAKY_RELU, Kind.SIGMOID, Kind.TANH,
                         Kind.SILU, Kind.HARDSWISH, Kind.GELU})
CONTAINERS = frozenset({Kind.SEQ, Kind.ADD2, Kind.REPEAT, Kind.NAMED})


class BlockStyle(enum.Enum):
    """ResNet block styles; `_DS` puts stride 2 on the 3x3 convolution (ResNet v1.5)."""

    RESNET_1_3_1 = "resnet_1_3_1"
    RESNET_1_3_1_DS = "resnet_1_3_1_ds"
    RESNET_3_3 = "resnet_3_3"
    RESNET_3_3_DS = "resnet_3_3_ds"

    @property
    def bottleneck(self) -> bool:
        return self in (BlockStyle.RESNET_1_3_1, BlockStyle.RESNET_1_3_1_DS)

    @property
    def stride(self) -> int:
        return 2 if self.name.endswith("_DS") else 1

    def __repr__(self) -> str:
        return f"BlockStyle.{self.name}"


# ---- parameter records, one per kind family --------------------------------------------
@dataclass(frozen=True)
class RepeatParams:
    times: int


@dataclass(frozen=True)
class NameParams:
    name: str


@dataclass(frozen=True)
class ConvParams:
    out_channels: int
    kernel: int
    stride: int
    padding: int


@dataclass(frozen=True)
class DepthwiseParams:
    kernel: int
    stride: int
    padding: int


@dataclass(frozen=True)
class GroupConvParams:
    out_channels: int
    groups: int
    kernel: int
    stride: int
    padding: int


@dataclass(frozen=True)
class BnParams:
    momentum: float
    eps: float


@dataclass(frozen=True)
class SlopeParams:
    slope: float


@dataclass(frozen=True)
class DropoutParams:
    p: float


@dataclass(frozen=True)
class FcParams:
    out_features: int
    bias: bool


@dataclass(frozen=True)
class PoolParams:
    kernel: int
    stride: int
    padding: int


@dataclass(frozen=True)
class ChannelPaddingParams:
    multiple: int


@dataclass(frozen=True)
class CbrParams:
    out_channels: int
    kernel: int
    stride: int
    padding: int
    momentum: float
    eps: float


@dataclass(frozen=True)
class CbrpParams:
    out_channels: int
    conv_kernel: int
    conv_stride: int
    conv_padding: int
    pool_kernel: int
    pool_stride: int
    pool_padding: int


@dataclass(frozen=True)
class BlockParams:
    style: BlockStyle
    mid_channels: int | None  # None for the basic (3x3, 3x3) styles
    out_channels: int


@dataclass(frozen=True)
class MbconvParams:
    expand_ratio: int
    out_channels: int
    stride: int
    kernel: int


# ---- the tree ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Layer:
    """One node of a network: a kind, its frozen parameter record, its child layers."""

    kind: Kind
    params: object = None
    children: tuple["Layer", ...] = ()

    def __repr__(self) -> str:
        from blueprint._factories import layer_code

        return layer_code(self)

    def walk(self, path: str = "") -> Iterator[tuple[str, "Layer"]]:
        """Yield `(dsl_path, layer)` for this layer and every descendant, parents first."""
        yield path or self.kind.value, self
        for index, child in enumerate(self.children):
            yield from child.walk(child_path(path or self.kind.value, self, index, child))

    def pretty(self, indent: str = "") -> str:
        """A tree printout for humans, one node a line."""
        from blueprint._factories import layer_head

        lines = [indent + layer_head(self)]
        lines += [child.pretty(indent + "  ") for child in self.children]
        return "\n".join(lines)


def child_path(parent_path: str, parent: Layer, index: int, child: Layer) -> str:
    """DSL path of a child, e.g. `seq[3].block`, `seq[0].add2.rhs`."""
    if parent.kind is Kind.ADD2:
        return f"{parent_path}.{'lhs' if index == 0 else 'rhs'}"
    if parent.kind in (Kind.REPEAT, Kind.NAMED):
        return f"{parent_path}.{child.kind.value}"
    return f"{parent_path}[{index}].{child.kind.value}"


def map_layers(layer: Layer, fn: Callable[[Layer], Layer]) -> Layer:
    """Rebuild a tree bottom-up, applying `fn` to every node (children first)."""
    children = tuple(map_layers(child, fn) for child in layer.children)
    if children != layer.children:
        layer = Layer(layer.kind, layer.params, children)
    return fn(layer)


@dataclass(frozen=True)
class BluePrint:
    """A whole network as one immutable value; wraps a root `Layer` and adds no semantics.

    >>> from blueprint import BluePrint, seq, conv, bn, relu
    >>> bp = BluePrint(seq(conv(16, 3, 1, 1), bn(), relu()))
    >>> bp == eval(repr(bp))
    True
    """

    root: Layer | None = None
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.root is not None and not isinstance(self.root, Layer):
            raise TypeError(f"BluePrint(root): expected a Layer, got {type(self.root).__name__}")

    @property
    def empty(self) -> bool:
        return self.root is None

    def walk(self) -> Iterator[tuple[str, Layer]]:
        return iter(()) if self.root is None else self.root.walk()

    def pretty(self) -> str:
        header = f"BluePrint {self.name}".rstrip()
        return header if self.root is None else header + "\n" + self.root.pretty("  ")

    def __repr__(self) -> str:
        return "BluePrint()" if self.root is None else f"BluePrint({self.root!r})"
