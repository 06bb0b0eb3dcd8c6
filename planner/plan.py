"""The records of a CompiledPlan: tensors, parameters, operands, ops, graphs, variants, regions.

Records link to each other by id and typed fields, never by name: an op names each operand by
its `Role` (plus the primitive `position` inside a fused op and the SSA `value` it stands for),
a parameter carries the ids of its gradient, fp16 copy and optimizer-state tensors. Names are
labels for people (checkpoint keys, error messages, summaries).

This module imports nothing from the planner but `planner._arch` (which imports nothing), so
every other module can import it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from planner._arch import ArchLayer, ArchPlan
from planner.ops import OPS

Shape = tuple[int, ...]

DTYPE_BYTES = {"float32": 4, "float16": 2, "int32": 4, "int64": 8, "uint8": 1}


class Region(StrEnum):
    """Where a tensor lives in the arena (see planner.memory)."""
    PARAMS = "params"          # fp32 master parameters
    WEIGHTS16 = "weights16"    # fp16 copies of the parameters (AMP)
    GRADS = "grads"
    OPTIM = "optim"            # optimizer state
    BN_STATS = "bn_stats"      # running statistics and counters
    IO = "io"                  # batch, labels, logits
    SCALARS = "scalars"        # loss, lr, step, loss scale, ...
    SAVED = "saved"            # written in forward, read in backward
    TRANSIENT = "transient"    # lives inside one op or between neighbouring ops

    @property
    def persistent(self) -> bool:
        return self not in PLANNED_REGIONS


PLANNED_REGIONS = (Region.SAVED, Region.TRANSIENT)
PERSISTENT_REGIONS = tuple(r for r in Region if r not in PLANNED_REGIONS)   # in arena order
REGIONS = PERSISTENT_REGIONS + PLANNED_REGIONS


class Role(StrEnum):
    """What an operand is to its op. Values are the names the registry and the kernels use."""
    # a primitive's inputs and output
    X = "x"
    A = "a"                    # add's two inputs
    B = "b"
    S = "s"                    # channel_mul's per-sample, per-channel scale
    Y = "y"
    # parameters and BN statistics (the registry's parameter suffixes)
    WEIGHT = "weight"
    BIAS = "bias"
    RUNNING_MEAN = "running_mean"
    RUNNING_VAR = "running_var"
    NUM_BATCHES_TRACKED = "num_batches_tracked"
    # extras (the registry's `Extra.role`): saved statistics, indices, masks, workspaces
    COL = "col"
    X_PADDED = "x_padded"      # AMP: a convolution's input zero-padded to 8k channels (schedule.padded_input_workspaces)
    ARGMAX = "argmax"
    MASK = "mask"
    SAVE_MEAN = "save_mean"
    SAVE_INVSTD = "save_invstd"
    # gradients
    DY = "dy"
    DX = "dx"                  # fused ops: one per input, its `value` says which
    DA = "da"
    DB = "db"
    DS = "ds"
    DWEIGHT = "dweight"
    DBIAS = "dbias"
    # fused ops, by `value`: a forward value saved for backward, its recompute workspace, its gradient
    SAVED = "saved"
    RECOMPUTE = "recompute"
    GRAD = "grad"              # also the optimizer's parameter gradients
    # loss
    LOGITS = "logits"
    LABELS = "labels"
    LOSS = "loss"
    CORRECT = "correct"
    DLOGITS = "dlogits"
    # optimizer
    PARAM = "param"
    STATE = "state"
    LR = "lr"
    STEP = "step"


#: the gradient each trainable parameter role writes in backward
PARAM_GRADIENT = {Role.WEIGHT: Role.DWEIGHT, Role.BIAS: Role.DBIAS}
_ROLES = {role.value: role for role in Role}


def role_named(name: str, where: str) -> Role:
    """The Role a registry name (parameter suffix, extra) stands for; unknown names raise."""
    role = _ROLES.get(name)
    if role is None:
        raise ValueError(f"{where}: the registry names an operand {name!r} that planner.plan.Role does not list; "
                         f"add it to Role")
    return role


#: each primitive's input operands, by role (its op-table row's `inputs`), and their gradients ("d" + role)
INPUT_ROLES = {prim: tuple(role_named(r, f"planner/ops.py: the inputs of {prim.value!r}") for r in row.inputs)
               for prim, row in OPS.items()}
GRADIENT_ROLES = {prim: tuple(role_named("d" + r, f"planner/ops.py: the input gradients of {prim.value!r}")
                              for r in row.inputs) for prim, row in OPS.items()}
#: gradients of a layer's inputs; they carry `accumulate`
INPUT_GRADIENTS = frozenset({Role.DX}.union(*GRADIENT_ROLES.values()))


def gradient_roles(layer: ArchLayer) -> tuple[Role, ...]:
    """The roles of a layer's input gradients: its row's, or for a fused kind `dx` per input (told apart by value)."""
    return GRADIENT_ROLES[layer.kind] if layer.kind in OPS else (Role.DX,) * len(layer.inputs)


# The records a compile makes by the thousand (ParamSpec, TensorSpec, Operand, Op) are named tuples:
# immutable like the plan's frozen dataclasses, copied with `_replace`, and about 4x cheaper to build
# (a ResNet-152 compile makes ~930 ParamSpecs, ~3,900 TensorSpecs twice, ~1,500 Ops).
class ParamSpec(NamedTuple):
    name: str
    tensor: int
    shape: Shape
    region: Region
    init: str
    layer: int               # index of the primitive in `CompiledPlan.primitives`
    torch_layout: str = ""   # "ohwi": conv weight; "fc_hwc": fc weight whose features come from an NHWC flatten
    flatten_from: Shape = ()  # (H, W, C) for "fc_hwc"
    fan_in: int = 0
    fan_out: int = 0
    role: Role = Role.WEIGHT  # what the parameter is to its primitive
    grad: int = -1           # its gradient tensor (trainable parameters of a training plan), else -1
    half: int = -1           # its fp16 copy (trainable parameters of an AMP plan), else -1
    state: tuple[int, ...] = ()  # its optimizer-state tensors, one per slot
    half_padded: int = -1    # AMP, a conv weight with Cin % 8 != 0: its fp16 copy padded to 8k channels (zero columns), else -1


class TensorSpec(NamedTuple):
    """One tensor of a plan: its slot (the largest shape over the variants that use it), its region and,
    once `plan_memory` has placed it, its byte offset in the arena."""

    id: int
    name: str
    region: Region
    dtype: str
    shape: Shape              # the slot's shape (largest variant)
    nbytes: int
    offset: int = -1          # -1 until plan_memory places it
    graph: str = ""           # "" for persistent tensors, else "train" / "eval"
    variant_shapes: tuple = ()  # ((variant, shape), ...) for graph and io tensors

    def shape_in(self, variant: str) -> Shape:
        for name, shape in self.variant_shapes:
            if name == variant:
                return shape
        return self.shape


class Operand(NamedTuple):
    """One tensor an op reads or writes, and what it is to the op."""

    role: Role
    tensor: int
    position: int = -1        # fused ops: the primitive (index in `CompiledPlan.primitives`) it belongs to
    value: int = -1           # fused ops: the SSA value it holds (SAVED, RECOMPUTE, GRAD) or whose gradient (DX)
    accumulate: bool = False  # input gradients: add onto what an earlier op wrote

    @property
    def label(self) -> str:
        """A readable name for summaries and errors: `3:weight`, `saved17`, `dx`."""
        text = self.role.value if self.value < 0 else f"{self.role.value}{self.value}"
        return text if self.position < 0 else f"{self.position}:{text}"


class Op(NamedTuple):
    index: int                # position in its graph's schedule (shadows tuple.index, which nothing here uses)
    kind: str                 # a registry kind, a fused kind, or "optimizer"
    direction: str            # "forward", "loss", "backward", "optimizer"
    layer: int                # index into arch.layers, -1 for the optimizer
    name: str
    reads: tuple[Operand, ...]
    writes: tuple[Operand, ...]
    attrs: tuple[tuple[str, object], ...] = ()

    def reading(self, role: Role, position: int = -1, value: int = -1) -> Operand | None:
        return _find(self.reads, role, position, value)

    def writing(self, role: Role, position: int = -1, value: int = -1) -> Operand | None:
        return _find(self.writes, role, position, value)

    def read(self, role: Role, position: int = -1, value: int = -1) -> int | None:
        """The tensor read in `role` (of the primitive at `position`, holding `value`), or None."""
        operand = _find(self.reads, role, position, value)
        return None if operand is None else operand.tensor

    def written(self, role: Role, position: int = -1, value: int = -1) -> int | None:
        operand = _find(self.writes, role, position, value)
        return None if operand is None else operand.tensor

    def attr(self, name: str, default=None):
        return next((v for k, v in self.attrs if k == name), default)


#: `new_record(Operand, (role, tensor, position, value, accumulate))`: a record built from every one of
#: its fields, in order, without the named tuple's Python-level `__new__`, which costs as much again as
#: the tuple itself. The compiler makes its thousands of records this way; the result is the same record.
new_record = tuple.__new__


def _find(operands, role, position, value):
    for operand in operands:
        if operand.role == role and operand.position == position and operand.value == value:
            return operand
    return None


@dataclass(frozen=True, slots=True)
class ComputationGraph:
    name: str
    ops: tuple[Op, ...]
    boundary: int = -1        # index of the first backward op (train graphs)


@dataclass(frozen=True, slots=True)
class VariantPlan:
    name: str
    graph: str
    input_shape: Shape
    signature: tuple          # (graph, input shape); equal signatures share one captured CUDA graph


@dataclass(frozen=True)
class CompiledPlan:
    arch: ArchPlan
    primitives: tuple[ArchLayer, ...]
    variants: dict[str, VariantPlan]
    value_shapes: dict[str, dict[int, Shape]]
    graphs: dict[str, ComputationGraph]
    tensors: tuple[TensorSpec, ...]
    params: tuple[ParamSpec, ...]
    memory: "object"
    io: dict[str, int]                       # "input", "labels", "logits", and scalar names -> tensor id
    macs_per_sample: dict[int, int]          # primitive index -> MACs for one sample
    activation_dtype: str
    training: bool
    optimizer_state_slots: int
    compile_ms: float = 0.0
    layer_values: dict[int, int] = field(default_factory=dict)  # value id -> tensor id (train graph, else eval)

    def tensor(self, tid: int) -> TensorSpec:
        return self.tensors[tid]

    @property
    def params_trainable(self) -> int:
        return sum(math.prod(p.shape) for p in self.params if p.region == Region.PARAMS)

    def verify(self) -> None:
        from planner.verify import verify_plan   # planner.verify imports nothing of the planner's
        verify_plan(self)
