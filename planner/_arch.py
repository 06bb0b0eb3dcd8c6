"""The expander's output: a flat, topologically ordered list of `ArchLayer`s (SSA values)."""
from __future__ import annotations

from dataclasses import dataclass, field

from planner.ops import PARAMETER_KINDS as _PARAMETER_PRIMS

NETWORK_INPUT = 0  # value id of the network input; every layer output gets a fresh id
# kinds whose layers are named by their parameter prefix; "bn" is BN before resolve_batchnorm_rank
PARAMETER_KINDS = _PARAMETER_PRIMS | {"bn"}
# fused kinds (fuse=True); each holds its unfused expansion in `sub`
FUSED = frozenset({"cbr", "basic_block", "bottleneck", "inv_residual", "gap_fc"})


@dataclass(frozen=True, slots=True)
class ArchLayer:
    """One layer of the flat plan.

    `inputs` are value ids (a residual `add` has two), `output` the value it defines.
    `params` is a sorted tuple of (name, value) pairs; `prefix` is the parameter-name
    prefix (`layer1.0.conv1`); `path` the DSL path it came from; `group` ties the
    primitives of one block/mbconv/cbr node together (-1 for none) so that fusion can
    merge them; `sub` holds the primitives of a fused layer.
    """

    kind: str
    params: tuple
    inputs: tuple[int, ...]
    output: int
    in_channels: int     # -1 where only shape inference knows (after a flatten)
    out_channels: int
    rank: int            # 4 for NHWC, 2 for (N, F)
    prefix: str
    path: str
    group: int = -1
    group_kind: str = ""
    first: bool = False  # consumes the network input: no input gradient is needed
    sub: tuple["ArchLayer", ...] = ()

    def param(self, name: str):
        """The value of the parameter ``name``. A name the layer does not carry raises instead of answering a
        default: a handler that asked for another kind's parameter would otherwise run without it."""
        for key, value in self.params:
            if key == name:
                return value
        carried = [key for key, _ in self.params]
        raise KeyError(f"{self.path}: the {self.kind} layer has no parameter {name!r}, only {carried} "
                       f"(a primitive carries its op-table row's attrs, planner/ops.py; read them through the row)")

    @property
    def name(self) -> str:
        """Parameter layers: their parameter prefix (`layer1.0.conv1`); others add the last DSL
        path component (`layer1.0.relu1`, `2.relu`) so that names stay readable and distinct."""
        if self.kind in PARAMETER_KINDS or self.sub or not self.prefix:
            return self.prefix or self.path
        return f"{self.prefix}.{self.path.rsplit('.', 1)[-1]}"

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params)
        ins = ",".join(f"%{v}" for v in self.inputs)
        text = f"%{self.output} = {self.kind}({args}) <- {ins}  [{self.in_channels}->{self.out_channels}] {self.prefix or '-'}"
        if self.first:
            text += " first"
        for sub in self.sub:
            text += "\n    " + sub.describe()
        return text


@dataclass(frozen=True, slots=True)
class ArchPlan:
    """A flat plan of a BluePrint plus how it was made (see `planner.expand.from_blueprint`)."""

    layers: tuple[ArchLayer, ...]
    in_channels: int
    input_channels_padded: int
    fuse: bool
    amp: bool
    passes: tuple[str, ...] = field(default=())

    from_blueprint = None  # set in planner/__init__ to planner.expand.arch_plan_from_blueprint

    @property
    def output_value(self) -> int:
        return self.layers[-1].inputs[0] if self.layers[-1].kind == "softmax_ce" else self.layers[-1].output

    def describe(self) -> str:
        return "\n".join(layer.describe() for layer in self.layers)
