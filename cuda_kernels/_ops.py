"""A CompiledPlan's ops as kernel launches: what the CUDA executor records into its tapes.

Every op of a schedule is one layer of the ArchPlan: a primitive (unfused plans) or a fused
kind (CBR, BasicBlock, Bottleneck, InvResidual, GapFc) holding its primitives in
``layer.sub``. Both run through the same per-primitive launchers; a fused op adds the
fusions of docs/internals/cuda-path.md ("Fusion in training") where its schedule allows them:

- forward: a convolution followed by its BatchNorm accumulates the batch statistics in its
  epilogue (``conv2d_forward(bn_sums=...)``); the BatchNorm's apply takes the residual add
  and the ReLU / ReLU6 that follow it, so the BN output and the pre-activation sum are
  never stored (they are transient values with one consumer);
- backward: values the plan did not save (BN outputs, activations inside a block) are
  recomputed from the saved pre-BN convolution outputs and batch statistics, with the same
  fused apply, only where a backward kernel reads them; then each primitive's backward runs
  in reverse order, gradients of internal values in the op's ``grad<v>`` workspaces; a ReLU / ReLU6
  applied straight to a BN output (no residual) has no launch of its own: the BN backward gates its
  output gradient, recomputing the gate from the BN input (``_batchnorm_gates``); a residual add's
  backward copies nothing where its inputs can share its output gradient (``_shared_sum_gradients``).

Each primitive's forward and backward launch is registered against its ``Prim`` in the CUDA kernel
table (``cuda_kernels._table.CUDA``; activations from ``elementwise.pointwise``); the chain above only
decides the fusions, then looks every primitive up there.

Operands are the planner's (``planner.plan.Operand``): unfused ops read ``Role.X``/``A``/``B``,
``WEIGHT``, ``SAVE_MEAN``, ...; fused ops name the primitive's ``position`` too
(``op.read(Role.WEIGHT, 3)``) and the ``value`` of saved / recomputed values and internal
gradients (``Role.SAVED``, ``RECOMPUTE``, ``GRAD``) and of their inputs' gradients (``Role.DX``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from planner.executor_api import dropout_seed
from planner.ops import OPS, Prim, activation_params
from planner.plan import GRADIENT_ROLES, INPUT_ROLES, PARAM_GRADIENT, Role

from . import batchnorm, channel_mul, drop_path, elementwise, loss, optim, padded_conv, pool, prelu
from .collective import SINGLE_REPLICA
from .mma_ops import DEFAULT_KERNELS, gemm_kernels
from ._table import CUDA

BATCHNORM = (Prim.BN2D, Prim.BN1D)
FUSABLE_ACTIVATIONS = frozenset(kind for kind in batchnorm.CLAMP if kind is not None)   # what the BN apply takes


def as_2d(a):
    """The (rows, channels) view of an NHWC or (N, F) activation."""
    channels = tuple(a.shape)[-1]
    return a.reshape(a.size // channels, channels)


def layer_positions(plan) -> list[range]:
    """Arch layer index -> the positions of its primitives in ``plan.primitives``."""
    positions, start = [], 0
    for layer in plan.arch.layers:
        count = len(layer.sub) or 1
        positions.append(range(start, start + count))
        start += count
    return positions


@dataclass
class StepContext:
    """What recording needs besides the op: tensor views of one variant and fixed settings."""
    plan: object
    views: dict            # tensor id -> device view (this variant's shapes)
    half: dict             # parameter tensor id -> its fp16 copy
    scalars: dict          # scalar name -> 1-element device view
    regions: dict          # "params", "grads", "optim", "weights16" -> flat device views
    seed: int
    smoothing: float
    optimizer: object
    kernels: str = DEFAULT_KERNELS   # GEMM family of conv / fc layers: "mma" (tensor cores) or "simt"
    collectives: object = SINGLE_REPLICA   # data parallel: the gradient and overflow all-reduces (collective)
    padded_weights: tuple = ()   # (master weight, fp16 copy padded to 8k channels) of each padded conv (padded_conv)
    padded: dict = field(default_factory=dict)   # conv weight tensor id -> that copy ("mma"; "simt": none)

    def __post_init__(self):
        self.gemm = gemm_kernels(self.kernels)
        self.consumers = Counter(v for prim in self.plan.primitives for v in prim.inputs)
        self.positions = layer_positions(self.plan)
        self.reduction = batchnorm.ReductionScratch()   # the BN reductions' accumulator (this step's stream)


class _OpView:
    """The views of one op, by role; fused ops name the primitive's position too."""

    def __init__(self, ctx, op, layer):
        self.ctx, self.op, self.layer = ctx, op, layer
        self.fused = bool(layer.sub)
        self.prims = list(zip(ctx.positions[op.layer], layer.sub or (layer,)))
        self.gates = _batchnorm_gates(self)
        self.gated = {position + 1 for position in self.gates}   # activations whose backward a BN runs

    def at(self, position):
        """The operand position of the primitive at ``position``: unfused ops have one, named -1."""
        return position if self.fused else -1

    def read(self, role, position=-1, value=-1):
        tid = self.op.read(role, position, value)
        return None if tid is None else self.ctx.views[tid]

    def written(self, role, position=-1, value=-1):
        tid = self.op.written(role, position, value)
        return None if tid is None else self.ctx.views[tid]

    def param(self, position, role, half=False):
        tid = self.op.read(role, self.at(position))
        if tid is None:
            return None
        return self.ctx.half[tid] if half else self.ctx.views[tid]

    def padded_conv(self, position):
        """``(weight copy padded to 8k channels, input workspace or None for a stem on the padded input slot)`` of
        a convolution run on its zero-padded input (``padded_conv``), else None."""
        padded = self.ctx.padded.get(self.op.read(Role.WEIGHT, self.at(position)))
        return None if padded is None else (padded, self.written(Role.X_PADDED, self.at(position)))


def _batchnorm_gates(ov):
    """BN position -> the ReLU / ReLU6 right after it in a fused op, on its output alone (no residual between): the
    BN backward gates that activation's output gradient itself (``batchnorm.GATE``), so the activation's backward
    launch, its saved output and the BN output's gradient are not read or written. Unfused plans: none."""
    gates = {}
    if ov.fused:
        for (position, prim), (_, nxt) in zip(ov.prims, ov.prims[1:]):
            if (prim.kind in BATCHNORM and nxt.kind in FUSABLE_ACTIVATIONS and nxt.inputs[0] == prim.output
                    and ov.ctx.consumers[prim.output] == 1):
                gates[position] = nxt
    return gates


# ---- forward ---------------------------------------------------------------------------------------------
@dataclass
class _Step:
    position: int
    prim: object
    inputs: list
    out: object        # device view
    sums_ready: bool = False   # BN: the convolution before it accumulated the batch sums
    bn_sums: tuple | None = None   # conv: (save_mean, save_invstd) of the BN after it, filled in the epilogue
    residual: object = None        # BN: the residual added in its apply
    activation: str | None = None  # BN: the activation applied in its apply (a key of batchnorm.CLAMP)
    apply_out: object = None       # BN: where the apply writes (the last fused step's output)


def _run_chain(launcher, ov, steps, mode, keep):
    """Launch the primitives of ``steps`` in order, each through the CUDA kernel table. ``mode``: "train"
    (batch statistics, running stats updated), "eval" (running statistics) or "recompute" (saved batch
    statistics). A convolution followed by its BN accumulates the batch sums in its epilogue; a BN output
    or a sum with one consumer that is not in ``keep`` is fused into the BN apply."""
    i = 0
    while i < len(steps):
        step = steps[i]
        prim, kind = step.prim, step.prim.kind
        following = steps[i + 1] if i + 1 < len(steps) else None
        last = i
        if (kind == Prim.CONV and mode == "train" and following is not None and following.prim.kind in BATCHNORM
                and following.prim.inputs[0] == prim.output):
            at = ov.at(following.position)
            step.bn_sums = ov.written(Role.SAVE_MEAN, at), ov.written(Role.SAVE_INVSTD, at)
            following.sums_ready = True
        elif kind in BATCHNORM:
            last = _fuse_into_batchnorm(ov, steps, i, keep)
        CUDA.lookup(kind, "forward", prim.path)(launcher, ov, step, mode)
        i = last + 1


def _fusible(step, value, keep, ov):
    return (step is not None and value in step.prim.inputs and value not in keep
            and ov.ctx.consumers[value] == 1)


def _fuse_into_batchnorm(ov, steps, i, keep):
    """BN (+ residual add) (+ ReLU / ReLU6) as one apply: fills the BN step's fusion fields and returns
    the index of the last step it covers."""
    bn = steps[i]
    value, last = bn.prim.output, i
    nxt = steps[last + 1] if last + 1 < len(steps) else None
    if nxt is not None and nxt.prim.kind == Prim.ADD and _fusible(nxt, value, keep, ov):
        other = nxt.inputs[1] if nxt.prim.inputs[0] == value else nxt.inputs[0]
        if other is not None:
            bn.residual, value, last = other, nxt.prim.output, last + 1
            nxt = steps[last + 1] if last + 1 < len(steps) else None
    if nxt is not None and nxt.prim.kind in FUSABLE_ACTIVATIONS and _fusible(nxt, value, keep, ov):
        bn.activation, last = nxt.prim.kind, last + 1
    bn.apply_out = steps[last].out
    return last


# ---- per-primitive forward launches: (launcher, op view, step, mode) ----------------------------------------
@CUDA.implements(Prim.CONV, "forward")
def _conv_forward(launcher, ov, step, mode):
    prim, padded = step.prim, ov.padded_conv(step.position)
    x, w = step.inputs[0], ov.param(step.position, Role.WEIGHT, half=True)
    if padded is not None:
        x, w = padded_conv.padded_forward_operands(launcher, x, *padded)
    ov.ctx.gemm.conv2d_forward(launcher, x, w, step.out, prim.param("stride"), prim.param("padding"),
                               prim.param("groups"), bn_sums=step.bn_sums)


@CUDA.implements(BATCHNORM, "forward")
def _batchnorm_forward(launcher, ov, step, mode):
    out = step.apply_out if step.apply_out is not None else step.out
    x2d, y2d = as_2d(step.inputs[0]), as_2d(out)
    at, prim = ov.at(step.position), step.prim
    gamma, beta = ov.param(step.position, Role.WEIGHT), ov.param(step.position, Role.BIAS)
    eps, activation, residual = prim.param("eps"), step.activation, step.residual
    if mode == "train":
        batchnorm.batchnorm_forward_train(
            launcher, x2d, gamma, beta, y2d, ov.written(Role.SAVE_MEAN, at), ov.written(Role.SAVE_INVSTD, at),
            ov.param(step.position, Role.RUNNING_MEAN), ov.param(step.position, Role.RUNNING_VAR), prim.param("momentum"),
            eps, activation=activation, residual=residual, sums_ready=step.sums_ready,
            collectives=ov.ctx.collectives, scratch=ov.ctx.reduction)
    elif mode == "eval":
        batchnorm.batchnorm_forward_eval(launcher, x2d, gamma, beta, ov.param(step.position, Role.RUNNING_MEAN),
                                          ov.param(step.position, Role.RUNNING_VAR), eps, y2d, activation=activation,
                                          residual=residual)
    else:
        batchnorm.batchnorm_apply_saved(launcher, x2d, gamma, beta, ov.read(Role.SAVE_MEAN, at),
                                         ov.read(Role.SAVE_INVSTD, at), eps, y2d, activation=activation,
                                         residual=residual, collectives=ov.ctx.collectives)


def _activation_forward(launcher, ov, step, mode):
    elementwise.activation_forward(launcher, step.prim.kind, step.inputs[0], step.out, activation_params(step.prim))


@CUDA.implements(Prim.ADD, "forward")
def _add_forward(launcher, ov, step, mode):
    elementwise.add_forward(launcher, step.inputs[0], step.inputs[1], step.out)


@CUDA.implements(Prim.FC, "forward")
def _fc_forward(launcher, ov, step, mode):
    ov.ctx.gemm.linear_forward(launcher, as_2d(step.inputs[0]), ov.param(step.position, Role.WEIGHT, half=True),
                               ov.param(step.position, Role.BIAS), step.out)


@CUDA.implements(Prim.GAP, "forward")
def _gap_forward(launcher, ov, step, mode):
    pool.gap_forward(launcher, step.inputs[0], step.out)


@CUDA.implements(Prim.FLATTEN, "forward")
def _flatten_forward(launcher, ov, step, mode):
    elementwise.accumulate_into(launcher, step.out, step.inputs[0].reshape(step.out.shape), False)


@CUDA.implements(Prim.MAXPOOL, "forward")
def _maxpool_forward(launcher, ov, step, mode):
    prim = step.prim
    pool.maxpool_forward(launcher, step.inputs[0], step.out, ov.written(Role.ARGMAX, ov.at(step.position)),
                          prim.param("kernel"), prim.param("stride"), prim.param("padding"))


@CUDA.implements(Prim.AVGPOOL, "forward")
def _avgpool_forward(launcher, ov, step, mode):
    prim = step.prim
    pool.avgpool_forward(launcher, step.inputs[0], step.out, prim.param("kernel"), prim.param("stride"),
                          prim.param("padding"))


@CUDA.implements(Prim.CHANNEL_PAD, "forward")
def _channel_pad_forward(launcher, ov, step, mode):
    elementwise.channel_pad_forward(launcher, step.inputs[0], step.out)


@CUDA.implements(Prim.DROPOUT, "forward")
def _dropout_forward(launcher, ov, step, mode):
    x, y = step.inputs[0], step.out
    if mode == "train":   # p = 0 too: the backward reads the mask (all ones then)
        elementwise.dropout_forward(launcher, x, y, ov.written(Role.MASK, ov.at(step.position)),
                                     step.prim.param("p"), dropout_seed(ov.ctx.seed, step.position),
                                     ov.ctx.scalars["iteration"])
    else:
        elementwise.accumulate_into(launcher, y, x, False)


@CUDA.implements(Prim.DROP_PATH, "forward")
def _drop_path_forward(launcher, ov, step, mode):
    x, y = step.inputs[0], step.out
    if mode == "train":
        drop_path.drop_path_forward(launcher, x, y, ov.written(Role.MASK, ov.at(step.position)), step.prim.param("p"),
                                     dropout_seed(ov.ctx.seed, step.position), ov.ctx.scalars["iteration"])
    else:
        elementwise.accumulate_into(launcher, y, x, False)


@CUDA.implements(Prim.PRELU, "forward")
def _prelu_forward(launcher, ov, step, mode):
    prelu.prelu_forward(launcher, step.inputs[0], ov.param(step.position, Role.WEIGHT), step.out)


@CUDA.implements(Prim.CHANNEL_MUL, "forward")
def _channel_mul_forward(launcher, ov, step, mode):
    channel_mul.channel_mul_forward(launcher, step.inputs[0], step.inputs[1], step.out)


def record_forward(launcher, ctx, op):
    ov = _OpView(ctx, op, ctx.plan.arch.layers[op.layer])
    values, steps = {}, []
    keep = {v for v, tid in _values_written(ov).items() if ctx.plan.tensor(tid).region == "saved"}
    keep.add(ov.layer.output)
    for position, prim in ov.prims:
        inputs = [values[v] if v in values else ov.read(role, ov.at(position))
                  for role, v in zip(INPUT_ROLES[prim.kind], prim.inputs)]
        out = ov.written(Role.Y, ov.at(position))
        values[prim.output] = out
        steps.append(_Step(position, prim, inputs, out))
    _run_chain(launcher, ov, steps, "train" if op.attr("training") else "eval", keep)


def _values_written(ov):
    return {prim.output: ov.op.written(Role.Y, ov.at(position)) for position, prim in ov.prims}


# ---- loss and optimizer ----------------------------------------------------------------------------------
@CUDA.implements(Prim.SOFTMAX_CE, "loss")
def record_loss(launcher, ctx, op):
    logits, labels = ctx.views[op.read("logits")], ctx.views[op.read("labels")]
    dlogits_tid = op.written("dlogits")
    dlogits = None if dlogits_tid is None else ctx.views[dlogits_tid]
    loss.softmax_cross_entropy(launcher, logits, labels, ctx.smoothing, ctx.views[op.written("loss")], dlogits,
                                None if dlogits is None else ctx.scalars["loss_scale"])
    loss.count_correct(launcher, logits, labels, ctx.views[op.written("correct")])


def record_optimizer(launcher, ctx, op):
    """Overflow check, one multi-tensor update over the whole parameter region (skipped on
    overflow), the loss-scale update, the counters, and the fp16 weight copies."""
    s, r = ctx.scalars, ctx.regions
    update = _optimizer_updates().get(type(ctx.optimizer))
    if update is None:
        raise TypeError(f"CudaExecutor: no update for the optimizer {type(ctx.optimizer).__name__}; expected one of "
                        f"{sorted(t.__name__ for t in _optimizer_updates())} (cuda_kernels/_ops.py _optimizer_updates)")
    ctx.collectives.gradients(launcher, r["grads"])    # the mean over the replicas (nothing in one process)
    optim.check_overflow(launcher, r["grads"], s["overflow"])
    ctx.collectives.overflow(launcher, s["overflow"])   # every replica skips the same steps
    update(launcher, ctx.optimizer, s, r)
    optim.finish_step(launcher, s["overflow"], s["loss_scale"], s["good_steps"], s["step"], s["iteration"])
    cast_half_weights(launcher, r["params"], r["weights16"], ctx.padded_weights)


def cast_half_weights(launcher, params, weights16, padded_weights):
    """The fp16 weight copies: element for element, and the padded copies (``padded_conv``) with them."""
    if padded_weights:
        padded_conv.cast_with_padded_weights(launcher, params, weights16, padded_weights)
    else:
        elementwise.cast_f32_to_f16(launcher, params, weights16)


def _sgd_update(launcher, opt, s, r):
    count = r["params"].size
    buf = r["optim"][:count] if opt.state_slots else r["grads"]   # never touched without momentum
    optim.sgd_step(launcher, r["params"], r["grads"], buf, s["lr"], s["step"], s["loss_scale"], s["overflow"],
                    opt.momentum_factor, opt.dampening_factor, opt.use_nesterov, opt.weight_decay_factor)


def _adam_update(launcher, opt, s, r):
    count = r["params"].size
    optim.adam_step(launcher, r["params"], r["grads"], r["optim"][:count], r["optim"][count:2 * count], s["lr"],
                     s["step"], s["loss_scale"], s["overflow"], opt.beta1, opt.beta2, opt.epsilon,
                     opt.weight_decay_factor, opt.decoupled)


def _optimizer_updates() -> dict:
    """The optimizer configuration's type -> its update (imported when a step is recorded: the kernels'
    module does not import the task's configuration vocabulary at import time)."""
    from blueprint.optim import SGD, Adam, AdamW
    return {SGD: _sgd_update, Adam: _adam_update, AdamW: _adam_update}


# ---- backward --------------------------------------------------------------------------------------------
class _Gradients:
    """Where each value's gradient goes inside one backward op, and whether to add into it. ``shared``: value ->
    the tensor that holds its gradient instead of its own workspace (``_shared_sum_gradients``)."""

    def __init__(self, ov):
        self.ov = ov
        self.written = set()
        self.shared = _shared_sum_gradients(ov)

    def of_output(self, value):
        ov = self.ov
        if value in self.shared:
            return ov.ctx.views[self.shared[value]]
        return ov.read(Role.DY) if value == ov.layer.output else ov.written(Role.GRAD, value=value)

    def target(self, value, role=None):
        """(view or None, accumulate) for the gradient of ``value``; ``role`` for unfused ops."""
        ov = self.ov
        if value in self.shared:
            tensor = self.shared[value]
            accumulate = tensor in self.written
            self.written.add(tensor)
            return ov.ctx.views[tensor], accumulate
        if ov.fused:
            operand = ov.op.writing(Role.DX if value in ov.layer.inputs else Role.GRAD, value=value)
        else:
            operand = ov.op.writing(role)
        if operand is None:
            return None, False
        accumulate = operand.accumulate or operand.tensor in self.written
        self.written.add(operand.tensor)
        return ov.ctx.views[operand.tensor], accumulate


def _shared_sum_gradients(ov):
    """A residual add passes its output's gradient unchanged to both inputs: rather than copying it (two
    ``accumulate_into`` launches), its inputs' gradients share the tensor that holds it (fused ops only).

    - an internal value whose only consumer is the add: nothing else ever writes its gradient, and the add's
      output gradient is complete (every consumer of the output ran its backward first), so both only read it;
    - the op's input, when its gradient (``DX``) is first written here: the add's output gradient is written
      straight into ``DX`` instead of its workspace, provided every reader of that gradient (the producers of the
      values sharing it, or the BN gating a shared activation) runs before anything else writes ``DX``, i.e. before
      the backward of every other consumer of the input (they run in reverse order: lower positions later).
    Where the add's output is the op's output, its gradient is the op's ``DY``, which the op only reads.
    Returns value -> tensor id."""
    shared = {}
    if not ov.fused:
        return shared
    ctx, producer = ov.ctx, {prim.output: position for position, prim in ov.prims}
    for position, prim in reversed(ov.prims):
        if prim.kind != Prim.ADD or len(set(prim.inputs)) != 2:
            continue
        internal = [v for v in prim.inputs if v in producer and ctx.consumers[v] == 1]
        if prim.output == ov.layer.output:   # the op's DY: only read here
            output = ov.op.read(Role.DY)
        elif prim.output in shared:
            output = shared[prim.output]
        else:
            output = ov.op.written(Role.GRAD, value=prim.output)
            outer = [v for v in prim.inputs if v in ov.layer.inputs]
            if outer and _dx_free_until_read(ov, outer[0], position, internal, producer):
                output = ov.op.writing(Role.DX, value=outer[0]).tensor
                shared[outer[0]] = shared[prim.output] = output
        for value in internal:
            shared[value] = output
    return shared


def _dx_free_until_read(ov, value, add_position, readers, producer):
    """Whether the gradient of the op input ``value`` can hold the add's output gradient (see above)."""
    operand = ov.op.writing(Role.DX, value=value)
    if operand is None or operand.accumulate:
        return False
    reads = [producer[v] - (1 if producer[v] in ov.gated else 0) for v in readers]
    writes = [position for position, prim in ov.prims if value in prim.inputs and position != add_position]
    return len(readers) == 1 and all(position < min(reads) for position in writes)


def _forward_values(ov):
    """Values the backward can read: saved ones, and (fused) the recompute workspaces."""
    values, recompute = {}, {}
    if ov.fused:
        values = {o.value: ov.ctx.views[o.tensor] for o in ov.op.reads if o.role is Role.SAVED}
        recompute = {o.value: ov.ctx.views[o.tensor] for o in ov.op.writes if o.role is Role.RECOMPUTE}
    else:
        prim = ov.prims[0][1]
        for role, value in ((Role.X, prim.inputs[0]), (Role.Y, prim.output)):
            if ov.read(role) is not None:
                values[value] = ov.read(role)
    return values, recompute


def _needed_values(ov):
    needed = set()
    for position, prim in ov.prims:
        if position in ov.gated:   # its BN recomputes the gate from the BN input
            continue
        saves = OPS[prim.kind].saves
        if "input" in saves:
            needed.add(prim.inputs[0])
        if "output" in saves:
            needed.add(prim.output)
    return needed


def _recompute(launcher, ov, values, recompute):
    """Recompute the unsaved forward values the backward reads, from saved ones (fused ops)."""
    needed = _needed_values(ov)
    wanted = {v for v in needed if v not in values}
    producer = {prim.output: (position, prim) for position, prim in ov.prims}
    closure, stack = set(), list(wanted)
    while stack:
        value = stack.pop()
        if value in closure or value in values:
            continue
        if value not in recompute or value not in producer:
            raise AssertionError(f"planner/executor mismatch: {ov.layer.path} backward needs value {value}, "
                                 f"which is neither saved nor recomputable")
        closure.add(value)
        stack.extend(producer[value][1].inputs)
    steps = []
    for position, prim in ov.prims:
        if prim.output in closure:
            inputs = [values.get(v, recompute.get(v)) for v in prim.inputs]
            steps.append(_Step(position, prim, inputs, recompute[prim.output]))
    _run_chain(launcher, ov, steps, "recompute", keep=needed)
    return {**values, **{v: recompute[v] for v in closure}}


def record_backward(launcher, ctx, op):
    ov = _OpView(ctx, op, ctx.plan.arch.layers[op.layer])
    values, recompute = _forward_values(ov)
    if ov.fused:
        values = _recompute(launcher, ov, values, recompute)
    grads = _Gradients(ov)
    for position, prim in reversed(ov.prims):
        if position not in ov.gated:
            _backward_primitive(launcher, ov, grads, values, position, prim)


def _backward_primitive(launcher, ov, grads, values, position, prim):
    CUDA.lookup(prim.kind, "backward", prim.path)(launcher, ov, grads, values, position, prim,
                                                  grads.of_output(prim.output))


# ---- per-primitive backward launches: (launcher, op view, gradients, forward values, position, primitive, dy) --
def _dparam(ov, position, role):
    return ov.written(PARAM_GRADIENT[role], ov.at(position))


@CUDA.implements(Prim.ADD, "backward")
def _add_backward(launcher, ov, grads, values, position, prim, dy):
    for role, value in zip(GRADIENT_ROLES[Prim.ADD], prim.inputs):
        if value in grads.shared:   # it already holds ``dy`` (_shared_sum_gradients)
            continue
        target, accumulate = grads.target(value, role)
        if target is not None:
            elementwise.accumulate_into(launcher, target, dy, accumulate)


@CUDA.implements(Prim.PRELU, "backward")
def _prelu_backward(launcher, ov, grads, values, position, prim, dy):
    dx, accumulate = grads.target(prim.inputs[0], Role.DX)
    prelu.prelu_backward(launcher, values[prim.inputs[0]], ov.param(position, Role.WEIGHT), dy, dx,
                          _dparam(ov, position, Role.WEIGHT), accumulate)


@CUDA.implements(Prim.CHANNEL_MUL, "backward")
def _channel_mul_backward(launcher, ov, grads, values, position, prim, dy):
    (dx, accumulate_dx), (ds, accumulate_ds) = (grads.target(value, role)
                                                for role, value in zip(GRADIENT_ROLES[Prim.CHANNEL_MUL], prim.inputs))
    at = ov.at(position)
    channel_mul.channel_mul_backward(launcher, ov.read(Role.X, at), ov.read(Role.S, at), dy, dx, ds, accumulate_dx,
                                      accumulate_ds)


@CUDA.implements(Prim.CONV, "backward")
def _conv_backward(launcher, ov, grads, values, position, prim, dy):
    dx, accumulate = grads.target(prim.inputs[0], Role.DX)
    x, w, dw = values[prim.inputs[0]], ov.param(position, Role.WEIGHT, half=True), _dparam(ov, position, Role.WEIGHT)
    stride, pad, padded = prim.param("stride"), prim.param("padding"), ov.padded_conv(position)
    if padded is not None:
        padded_conv.conv2d_backward(launcher, x, w, *padded, dy, dx, dw, stride, pad, accumulate)
        return
    ov.ctx.gemm.conv2d_backward(launcher, x, w, dy, dx, dw, stride, pad, prim.param("groups"), accumulate)


@CUDA.implements(Prim.FC, "backward")
def _fc_backward(launcher, ov, grads, values, position, prim, dy):
    dx, accumulate = grads.target(prim.inputs[0], Role.DX)
    ov.ctx.gemm.linear_backward(launcher, as_2d(values[prim.inputs[0]]), ov.param(position, Role.WEIGHT, half=True), dy,
                                None if dx is None else as_2d(dx), _dparam(ov, position, Role.WEIGHT),
                                _dparam(ov, position, Role.BIAS), accumulate)


@CUDA.implements(BATCHNORM, "backward")
def _batchnorm_backward(launcher, ov, grads, values, position, prim, dy):
    dx, accumulate = grads.target(prim.inputs[0], Role.DX)
    at, gate = ov.at(position), ov.gates.get(position)
    if gate is not None:   # the activation after it: its output's gradient, gated in the BN kernels
        dy = grads.of_output(gate.output)
    saved = ov.read(Role.SAVE_MEAN, at), ov.read(Role.SAVE_INVSTD, at)
    batchnorm.batchnorm_backward(launcher, as_2d(values[prim.inputs[0]]), ov.param(position, Role.WEIGHT), *saved,
                                  as_2d(dy), None if dx is None else as_2d(dx), _dparam(ov, position, Role.WEIGHT),
                                  _dparam(ov, position, Role.BIAS), accumulate, eps=prim.param("eps"),
                                  collectives=ov.ctx.collectives,
                                  scratch=ov.ctx.reduction, beta=ov.param(position, Role.BIAS),
                                  activation=None if gate is None else gate.kind)


def _input_only(backward):
    """A backward with no parameter gradients: nothing to launch when the input needs no gradient."""
    def launch(launcher, ov, grads, values, position, prim, dy):
        dx, accumulate = grads.target(prim.inputs[0], Role.DX)
        if dx is not None:
            backward(launcher, ov, values, position, prim, dy, dx, accumulate)
    return launch


def _activation_backward(launcher, ov, values, position, prim, dy, dx, accumulate):
    saved = values[prim.output if OPS[prim.kind].saves == ("output",) else prim.inputs[0]]
    elementwise.activation_backward(launcher, prim.kind, saved, dy, dx, activation_params(prim), accumulate)


def _gap_backward(launcher, ov, values, position, prim, dy, dx, accumulate):
    pool.gap_backward(launcher, dy, dx, accumulate)


def _flatten_backward(launcher, ov, values, position, prim, dy, dx, accumulate):
    elementwise.accumulate_into(launcher, dx, dy.reshape(dx.shape), accumulate)


def _maxpool_backward(launcher, ov, values, position, prim, dy, dx, accumulate):
    pool.maxpool_backward(launcher, ov.read(Role.ARGMAX, ov.at(position)), dy, dx, prim.param("kernel"),
                           prim.param("stride"), prim.param("padding"), accumulate)


def _avgpool_backward(launcher, ov, values, position, prim, dy, dx, accumulate):
    pool.avgpool_backward(launcher, dy, dx, prim.param("kernel"), prim.param("stride"), prim.param("padding"),
                           accumulate)


def _channel_pad_backward(launcher, ov, values, position, prim, dy, dx, accumulate):
    elementwise.channel_pad_backward(launcher, dy, dx, accumulate)


def _dropout_backward(launcher, ov, values, position, prim, dy, dx, accumulate):
    elementwise.dropout_backward(launcher, ov.read(Role.MASK, ov.at(position)), dy, dx, prim.param("p"), accumulate)


def _drop_path_backward(launcher, ov, values, position, prim, dy, dx, accumulate):
    drop_path.drop_path_backward(launcher, ov.read(Role.MASK, ov.at(position)), dy, dx, prim.param("p"), accumulate)


for _prim, _backward in ((Prim.GAP, _gap_backward), (Prim.FLATTEN, _flatten_backward),
                         (Prim.MAXPOOL, _maxpool_backward), (Prim.AVGPOOL, _avgpool_backward),
                         (Prim.CHANNEL_PAD, _channel_pad_backward), (Prim.DROPOUT, _dropout_backward),
                         (Prim.DROP_PATH, _drop_path_backward)):
    CUDA.register(_prim, "backward", _input_only(_backward))
# activations: those with kernels in cuda_kernels/elementwise.py (a missing one fails CUDA.check_plan)
for _prim in elementwise.ACTIVATION_KERNELS:
    CUDA.register(_prim, "forward", _activation_forward)
    CUDA.register(_prim, "backward", _input_only(_activation_backward))


def record_op(launcher, ctx, op):
    if op.direction == "forward":
        record_forward(launcher, ctx, op)
    elif op.direction == "loss":
        CUDA.lookup(op.kind, "loss", op.name)(launcher, ctx, op)
    elif op.direction == "backward":
        record_backward(launcher, ctx, op)
    else:
        record_optimizer(launcher, ctx, op)
