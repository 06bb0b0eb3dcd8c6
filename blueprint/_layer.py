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
    """Every DSL node kind; a value is its factory's name. A leaf spelled like a primitive of the
    planner's op table (`planner.ops.Prim`: relu, fc, dropout, ...) expands to that primitive. The two
    enums are written out separately on purpose: the DSL imports nothing from the planner, and each has
    members the other lacks (seq, cbr, mbconv here; bn2d, add, softmax_ce there)."""

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
    HARDSIGMOID = "hardsigmoid"
    DROPOUT = "dropout"
    DROP_PATH = "drop_path"
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
    SE = "se"



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
class DropPathParams:
    p: float


@dataclass(frozen=True)
class SeParams:
    """Squeeze-excitation: `squeeze` channels (an int), or a fraction of the input channels (a float in
    (0, 1]: max(1, int(C * fraction))); `gate` and `act` are activation kind names."""
    squeeze: int | float
    gate: str
    act: str


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
    act: str = "relu6"                 # activation kind name of the expand and depthwise stages
    se: "Layer | None" = None          # an se(...) layer between the depthwise and the project stage
    drop_path: float = 0.0             # stochastic depth on the residual branch (identity shortcut only)
    expanded_channels: int = 0         # 0: in_channels * expand_ratio
    momentum: float = 0.1              # of every BatchNorm in the block
    eps: float = 1e-5


# ---- the tree ----------------------------------------------------------------------------
#: `pretty()` indents two spaces a level up to this depth; deeper lines carry their depth as a
#: number instead, so that a 10,000-deep chain prints in linear, not quadratic, size.
PRETTY_MAX_INDENT = 40


@dataclass(frozen=True, eq=False)
class Layer:
    """One node of a network: a kind, its frozen parameter record, its child layers.

    Equality and hashing are structural and, like `repr`, `walk` and `pretty`, iterative: a
    tree as deep as memory allows (`for _ in range(10_000): net = seq(net, relu())`) works.
    A node's hash is computed once and cached (the node is immutable).
    """

    kind: Kind
    params: object = None
    children: tuple["Layer", ...] = ()

    def __repr__(self) -> str:
        return layer_code(self)

    def __hash__(self) -> int:
        cached = self.__dict__.get("_hash")
        return cached if cached is not None else _structural_hash(self)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Layer):
            return NotImplemented
        return _structurally_equal(self, other)

    def walk(self, path: str = "") -> Iterator[tuple[str, "Layer"]]:
        """Yield `(dsl_path, layer)` for this layer and every descendant, parents first."""
        stack = [(path or self.kind.value, self)]
        while stack:
            node_path, node = stack.pop()
            yield node_path, node
            for index in reversed(range(len(node.children))):
                child = node.children[index]
                stack.append((child_path(node_path, node, index, child), child))

    def pretty(self, indent: str = "") -> str:
        """A tree printout for humans, one node a line."""
        lines, stack = [], [(self, 0)]
        while stack:
            node, depth = stack.pop()
            margin = "  " * min(depth, PRETTY_MAX_INDENT) + (f"[depth {depth}] " if depth > PRETTY_MAX_INDENT else "")
            lines.append(indent + margin + layer_head(node))
            stack.extend((child, depth + 1) for child in reversed(node.children))
        return "\n".join(lines)


def _structural_hash(root: Layer) -> int:
    """Hash every not yet hashed node below `root`, children first, caching each on its node."""
    stack = [root]
    while stack:
        node = stack[-1]
        if "_hash" in node.__dict__:
            stack.pop()
            continue
        pending = [child for child in node.children if "_hash" not in child.__dict__]
        if pending:
            stack.extend(pending)
            continue
        value = hash((node.kind, node.params, tuple(child.__dict__["_hash"] for child in node.children)))
        object.__setattr__(node, "_hash", value)
        stack.pop()
    return root.__dict__["_hash"]


def _structurally_equal(a: Layer, b: Layer) -> bool:
    """Pairwise walk of both trees; shared subtrees (`repeat`, reused blocks) are compared once."""
    stack, compared = [(a, b)], set()
    while stack:
        x, y = stack.pop()
        if x is y or (id(x), id(y)) in compared:
            continue
        compared.add((id(x), id(y)))
        if x.kind is not y.kind or len(x.children) != len(y.children) or x.params != y.params:
            return False
        hx, hy = x.__dict__.get("_hash"), y.__dict__.get("_hash")
        if hx is not None and hy is not None and hx != hy:
            return False
        stack.extend(zip(x.children, y.children))
    return True


def child_path(parent_path: str, parent: Layer, index: int, child: Layer) -> str:
    """DSL path of a child, e.g. `seq[3].block`, `seq[0].add2.rhs`."""
    if parent.kind is Kind.ADD2:
        return f"{parent_path}.{'lhs' if index == 0 else 'rhs'}"
    if parent.kind in (Kind.REPEAT, Kind.NAMED):
        return f"{parent_path}.{child.kind.value}"
    return f"{parent_path}[{index}].{child.kind.value}"


def map_layers(layer: Layer, fn: Callable[[Layer], Layer]) -> Layer:
    """Rebuild a tree bottom-up, applying `fn` to every node (children first); a subtree shared
    by several parents is mapped once and stays shared."""
    mapped: dict[int, Layer] = {}
    stack = [layer]
    while stack:
        node = stack[-1]
        if id(node) in mapped:
            stack.pop()
            continue
        pending = [child for child in node.children if id(child) not in mapped]
        if pending:
            stack.extend(pending)
            continue
        children = tuple(mapped[id(child)] for child in node.children)
        if any(new is not old for new, old in zip(children, node.children)):
            node_now = Layer(node.kind, node.params, children)
        else:
            node_now = node
        mapped[id(node)] = fn(node_now)
        stack.pop()
    return mapped[id(layer)]


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


# ---- printing ----------------------------------------------------------------------------
_DEFAULT_BN = BnParams(0.1, 1e-5)


def _args(layer: Layer) -> list[str]:
    p = layer.params
    kind = layer.kind
    if kind in (Kind.CONV,):
        return [str(p.out_channels), str(p.kernel), str(p.stride), str(p.padding)]
    if kind is Kind.CONV_DW:
        return [str(p.kernel), str(p.stride), str(p.padding)]
    if kind is Kind.GROUP_CONV:
        return [str(p.out_channels), str(p.groups), str(p.kernel), str(p.stride), str(p.padding)]
    if kind in (Kind.MAXPOOL, Kind.AVGPOOL):
        return [str(p.kernel), str(p.stride), str(p.padding)]
    if kind is Kind.BN:
        return [] if p == _DEFAULT_BN else [repr(p.momentum), repr(p.eps)]
    if kind is Kind.LEAKY_RELU:
        return [repr(p.slope)]
    if kind in (Kind.DROPOUT, Kind.DROP_PATH):
        return [repr(p.p)]
    if kind is Kind.SE:
        tail = [repr(p.gate), repr(p.act)] if p.act != "relu" else [repr(p.gate)] if p.gate != "sigmoid" else []
        return [repr(p.squeeze)] + tail
    if kind in (Kind.FC, Kind.GAP_FC):
        return [str(p.out_features)] + ([] if p.bias else ["False"])
    if kind is Kind.CHANNEL_PADDING:
        return [str(p.multiple)]
    if kind is Kind.CBR:
        extra = [] if (p.momentum, p.eps) == (0.1, 1e-5) else [repr(p.momentum), repr(p.eps)]
        return [str(p.out_channels), str(p.kernel), str(p.stride), str(p.padding)] + extra
    if kind is Kind.CBRP:
        return [str(v) for v in (p.out_channels, p.conv_kernel, p.conv_stride, p.conv_padding,
                                 p.pool_kernel, p.pool_stride, p.pool_padding)]
    if kind is Kind.BLOCK:
        channels = [] if p.mid_channels is None else [str(p.mid_channels)]
        return channels + [str(p.out_channels), repr(p.style)]
    if kind is Kind.MBCONV:
        return _mbconv_args(p)
    if kind is Kind.REPEAT:
        return [str(p.times)]
    if kind is Kind.NAMED:
        return [repr(p.name)]
    return []


_MBCONV_DEFAULTS = MbconvParams(1, 1, 1, 3)
_MBCONV_OPTIONAL = ("kernel", "act", "se", "drop_path", "expanded_channels", "momentum", "eps")


def _mbconv_args(p: MbconvParams) -> list[str]:
    """The three required arguments, then the optional ones up to the last that is not its default
    (positional: the repr grammar has no keyword arguments)."""
    optional = [getattr(p, name) for name in _MBCONV_OPTIONAL]
    defaults = [getattr(_MBCONV_DEFAULTS, name) for name in _MBCONV_OPTIONAL]
    while optional and optional[-1] == defaults[len(optional) - 1]:
        optional.pop()
    return [str(p.expand_ratio), str(p.out_channels), str(p.stride)] + [repr(v) for v in optional]


def layer_code(layer: Layer) -> str:
    """DSL code that rebuilds `layer`: `eval(layer_code(x)) == x` with `from blueprint import *`.

    Iterative: a stack of nodes still to print and text to emit after their children."""
    out, stack = [], [layer]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        parts = _container_parts(item)
        if parts is None:
            out.append(f"{item.kind.value}({', '.join(_args(item))})")
            continue
        prefix, suffix = parts
        out.append(prefix)
        stack.append(suffix)
        for index in reversed(range(len(item.children))):
            stack.append(item.children[index])
            if index:
                stack.append(", ")
    return "".join(out)


def _container_parts(layer: Layer) -> tuple[str, str] | None:
    """The code around a container's children (`seq(` ... `)`), or None for a leaf."""
    if layer.kind in (Kind.SEQ, Kind.ADD2):
        return f"{layer.kind.value}(", ")"
    if layer.kind is Kind.REPEAT:
        return "repeat(", f", {layer.params.times})"
    if layer.kind is Kind.NAMED:
        return f"named({layer.params.name!r}, ", ")"
    return None


def layer_head(layer: Layer) -> str:
    """One line for `pretty()`: containers print their kind, leaves their full code."""
    if layer.kind in (Kind.SEQ, Kind.ADD2):
        return layer.kind.value
    if layer.kind in (Kind.REPEAT, Kind.NAMED):
        return f"{layer.kind.value}({', '.join(_args(layer))})"
    return layer_code(layer)
