"""The frozen values a network is written in: `Kind`, parameter records, `Layer`, `BluePrint`.

A `Layer` is a kind, a frozen parameter record and a tuple of child layers. Nothing here
is ever mutated: equality and hashing are structural, and `repr()` is DSL code that
evaluates back to an equal value (see `blueprint._factories` for the code each kind prints).
"""
from __future__ import annotations

import enum
import math
from dataclasses import MISSING, dataclass, field, fields
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
    ELU = "elu"
    CELU = "celu"
    SELU = "selu"
    SOFTPLUS = "softplus"
    MISH = "mish"
    PRELU = "prelu"
    HARDTANH = "hardtanh"
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
# A record's fields are its factory's arguments, in the factory's order. `repr` prints them positionally
# (`_args`): a field with a default only up to the last one that differs from its default. A field
# made with `bounded` (or `at_least`) also states what its factory accepts and a valid value other than
# the default (`example`), from which the tests build their calls of every parameterised factory.

def bounded(default: float, low: float, high: float, example: float, *, low_open: bool = False,
            high_open: bool = False):
    """A float field in [low, high] (either end open); ``example``: a valid value other than ``default``."""
    return field(default=default, metadata={"float": (low, high, low_open, high_open), "example": example})


def at_least(default: int, minimum: int, example: int):
    """An int field >= ``minimum``; ``example``: a valid value other than ``default``."""
    return field(default=default, metadata={"int": minimum, "example": example})


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
    momentum: float = 0.1
    eps: float = 1e-5


@dataclass(frozen=True)
class SlopeParams:
    slope: float = bounded(0.01, 0.0, 1.0, 0.2, high_open=True)


@dataclass(frozen=True)
class EluParams:
    alpha: float = bounded(1.0, 0.0, math.inf, 0.6, high_open=True)


@dataclass(frozen=True)
class CeluParams:
    alpha: float = bounded(1.0, 0.0, math.inf, 1.7, low_open=True, high_open=True)


@dataclass(frozen=True)
class SoftplusParams:
    beta: float = bounded(1.0, 0.0, math.inf, 2.0, low_open=True, high_open=True)
    threshold: float = bounded(20.0, 0.0, math.inf, 0.5, low_open=True, high_open=True)


@dataclass(frozen=True)
class HardtanhParams:
    min_val: float = bounded(-1.0, -math.inf, math.inf, -0.5, high_open=True)
    max_val: float = bounded(1.0, -math.inf, math.inf, 2.0, high_open=True)


@dataclass(frozen=True)
class PreluParams:
    num_parameters: int = at_least(1, 1, 3)   # 1: one slope shared by every channel; else one per channel


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
    gate: str = "sigmoid"
    act: str = "relu"


@dataclass(frozen=True)
class FcParams:
    out_features: int
    bias: bool = True


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
    momentum: float = 0.1
    eps: float = 1e-5


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
    mid_channels: int | None = field(metadata={"omit_none": True})  # None for the basic (3x3, 3x3) styles
    out_channels: int
    style: BlockStyle


@dataclass(frozen=True)
class MbconvParams:
    expand_ratio: int
    out_channels: int
    stride: int
    kernel: int = 3
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
def _args(layer: Layer) -> list[str]:
    """The positional arguments that rebuild ``layer.params``: its record's fields in order, each as a literal
    (``repr``), up to the last field that has no default or differs from it; a field marked ``omit_none``
    is left out while it is None (block's optional leading mid_channels)."""
    record = layer.params
    if record is None:
        return []
    items = [(f, getattr(record, f.name)) for f in fields(record)
             if not (f.metadata.get("omit_none") and getattr(record, f.name) is None)]
    while items and items[-1][0].default is not MISSING and items[-1][1] == items[-1][0].default:
        items.pop()
    return [repr(value) for _, value in items]


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
