"""A CompiledPlan's ops as kernel launches: what the CUDA executor records into its tapes.

Every op of a schedule is one layer of the ArchPlan: a primitive (unfused plans) or a fused
kind (CBR, BasicBlock, Bottleneck, InvResidual, GapFc) holding its primitives in
``layer.sub``. Both run through the same per-primitive launchers; a fused op adds the
fusions of DESIGN.md §5 where its schedule allows them:

- forward: a convolution followed by its BatchNorm accumulates the batch statistics in its
  epilogue (``conv2d_forward(bn_sums=...)``); the BatchNorm's apply takes the residual add
  and the ReLU / ReLU6 that follow it, so the BN output and the pre-activation sum are
  never stored (they are transient values with one consumer);
- backward: values the plan did not save (BN outputs, activations inside a block) are
  recomputed from the saved pre-BN convolution outputs and batch statistics, with the same
  fused apply, only where a backward kernel reads them; then each primitive's backward runs
  in reverse order, gradients of internal values in the op's ``grad<v>`` workspaces.

Roles are the planner's (``planner.compiler``): unfused ops read ``x``/``a``/``b``,
``weight``, ``save_mean``, ...; fused ops prefix them with the primitive's position
(``3:weight``) and name saved / recomputed values and internal gradients ``saved<v>``,
``recompute<v>``, ``grad<v>``, their inputs' gradients ``dx<i>``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from planner.executor_api import dropout_seed

from . import _batchnorm, _channel_mul, _drop_path, _elementwise, _loss, _optim, _pool
from ._elementwise import ACTIVATION_SAVES_OUTPUT
from ._mma_ops import DEFAULT_KERNELS, gemm_kernels

BATCHNORM = ("bn2d", "bn1d")
# what each primitive's backward reads of its forward values: "in" its input(s), "out" its output
_ACTIVATION_CODES = ("relu", "relu6", "leaky_relu", "sigmoid", "tanh", "silu", "hardswish", "gelu", "hardsigmoid")
BACKWARD_READS = {"conv": "in", "fc": "in", "bn2d": "in", "bn1d": "in",
                  **{k: ("out" if code in ACTIVATION_SAVES_OUTPUT else "in") for code, k in enumerate(_ACTIVATION_CODES)}}
FUSABLE_ACTIVATIONS = frozenset({"relu", "relu6"})   # what the BN apply can take (``_batchnorm.CLAMP``)


def activation_code(kind):
    return _ACTIVATION_CODES.index(kind)


def input_roles(prim):
    return ("a", "b") if prim.kind == "add" else ("x", "s") if prim.kind == "channel_mul" else ("x",)


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

    def __post_init__(self):
        self.gemm = gemm_kernels(self.kernels)
        self.consumers = Counter(v for prim in self.plan.primitives for v in prim.inputs)
        self.positions = layer_positions(self.plan)


class _OpView:
    """The views of one op, by role; fused ops prefix roles with the primitive's position."""

    def __init__(self, ctx, op, layer):
        self.ctx, self.op, self.layer = ctx, op, layer
        self.fused = bool(layer.sub)
        self.prims = list(zip(ctx.positions[op.layer], layer.sub or (layer,)))

    def tag(self, position):
        return f"{position}:" if self.fused else ""

    def read(self, role):
        tid = self.op.read(role)
        return None if tid is None else self.ctx.views[tid]

    def written(self, role):
        tid = self.op.written(role)
        return None if tid is None else self.ctx.views[tid]

    def param(self, position, suffix, half=False):
        tid = self.op.read(self.tag(position) + suffix)
        if tid is None:
            return None
        return self.ctx.half[tid] if half else self.ctx.views[tid]


# ---- forward ---------------------------------------------------------------------------------------------
@dataclass
class _Step:
    position: int
    prim: object
    inputs: list
    out: object        # device view
    sums_ready: bool = False   # BN: the convolution before it accumulated the batch sums


def _run_chain(launcher, ov, steps, mode, keep):
    """Launch the primitives of ``steps`` in order. ``mode``: "train" (batch statistics, running
    stats updated), "eval" (running statistics) or "recompute" (saved batch statistics). A BN
    output or a sum with one consumer that is not in ``keep`` is fused into the apply."""
    i = 0
    while i < len(steps):
        step = steps[i]
        prim, kind = step.prim, step.prim.kind
        following = steps[i + 1] if i + 1 < len(steps) else None
        if kind == "conv":
            sums = None
            if (mode == "train" and following is not None and following.prim.kind in BATCHNORM
                    and following.prim.inputs[0] == prim.output):
                sums = (ov.written(ov.tag(following.position) + "save_mean"),
                        ov.written(ov.tag(following.position) + "save_invstd"))
            ov.ctx.gemm.conv2d_forward(launcher, step.inputs[0], ov.param(step.position, "weight", half=True),
                                       step.out, prim.param("stride"), prim.param("padding"), prim.param("groups"),
                                       bn_sums=sums)
            if sums is not None:
                following.sums_ready = True
            i += 1
        elif kind in BATCHNORM:
            i = _batchnorm_chain(launcher, ov, steps, i, mode, keep)
        else:
            _forward_primitive(launcher, ov, step, mode)
            i += 1


def _fusible(step, value, keep, ov):
    return (step is not None and value in step.prim.inputs and value not in keep
            and ov.ctx.consumers[value] == 1)


def _batchnorm_chain(launcher, ov, steps, i, mode, keep):
    """BN (+ residual add) (+ ReLU / ReLU6) as one apply; returns the index of the next step."""
    bn = steps[i]
    value, residual, activation, last = bn.prim.output, None, None, i
    nxt = steps[last + 1] if last + 1 < len(steps) else None
    if nxt is not None and nxt.prim.kind == "add" and _fusible(nxt, value, keep, ov):
        other = nxt.inputs[1] if nxt.prim.inputs[0] == value else nxt.inputs[0]
        if other is not None:
            residual, value, last = other, nxt.prim.output, last + 1
            nxt = steps[last + 1] if last + 1 < len(steps) else None
    if nxt is not None and nxt.prim.kind in FUSABLE_ACTIVATIONS and _fusible(nxt, value, keep, ov):
        activation, last = nxt.prim.kind, last + 1
    out = steps[last].out
    x2d, y2d = as_2d(bn.inputs[0]), as_2d(out)
    tag, prim = ov.tag(bn.position), bn.prim
    gamma, beta = ov.param(bn.position, "weight"), ov.param(bn.position, "bias")
    eps = prim.param("eps")
    if mode == "train":
        _batchnorm.batchnorm_forward_train(
            launcher, x2d, gamma, beta, y2d, ov.written(tag + "save_mean"), ov.written(tag + "save_invstd"),
            ov.param(bn.position, "running_mean"), ov.param(bn.position, "running_var"), prim.param("momentum"), eps,
            activation=activation, residual=residual, sums_ready=bn.sums_ready)
    elif mode == "eval":
        _batchnorm.batchnorm_forward_eval(launcher, x2d, gamma, beta, ov.param(bn.position, "running_mean"),
                                          ov.param(bn.position, "running_var"), eps, y2d, activation=activation,
                                          residual=residual)
    else:
        _batchnorm.batchnorm_apply_saved(launcher, x2d, gamma, beta, ov.read(tag + "save_mean"),
                                         ov.read(tag + "save_invstd"), eps, y2d, activation=activation,
                                         residual=residual)
    return last + 1


def _forward_primitive(launcher, ov, step, mode):
    prim, kind, x, y = step.prim, step.prim.kind, step.inputs[0], step.out
    if kind in _ACTIVATION_CODES:
        _elementwise.activation_forward(launcher, activation_code(kind), x, y, prim.param("slope", 0.01))
    elif kind == "add":
        _elementwise.add_forward(launcher, x, step.inputs[1], y)
    elif kind == "fc":
        ov.ctx.gemm.linear_forward(launcher, as_2d(x), ov.param(step.position, "weight", half=True),
                                   ov.param(step.position, "bias"), y)
    elif kind == "gap":
        _pool.gap_forward(launcher, x, y)
    elif kind == "flatten":
        _elementwise.accumulate_into(launcher, y, x.reshape(y.shape), False)
    elif kind == "maxpool":
        _pool.maxpool_forward(launcher, x, y, ov.written(ov.tag(step.position) + "argmax"), prim.param("kernel"),
                              prim.param("stride"), prim.param("padding"))
    elif kind == "avgpool":
        _pool.avgpool_forward(launcher, x, y, prim.param("kernel"), prim.param("stride"), prim.param("padding"))
    elif kind == "channel_pad":
        _elementwise.channel_pad_forward(launcher, x, y)
    elif kind == "dropout":
        if mode == "train":   # p = 0 too: the backward reads the mask (all ones then)
            _elementwise.dropout_forward(launcher, x, y, ov.written(ov.tag(step.position) + "mask"), prim.param("p"),
                                         dropout_seed(ov.ctx.seed, step.position), ov.ctx.scalars["iteration"])
        else:
            _elementwise.accumulate_into(launcher, y, x, False)
    elif kind == "channel_mul":
        _channel_mul.channel_mul_forward(launcher, x, step.inputs[1], y)
    elif kind == "drop_path":
        if mode == "train":
            _drop_path.drop_path_forward(launcher, x, y, ov.written(ov.tag(step.position) + "mask"), prim.param("p"),
                                         dropout_seed(ov.ctx.seed, step.position), ov.ctx.scalars["iteration"])
        else:
            _elementwise.accumulate_into(launcher, y, x, False)
    else:
        raise NotImplementedError(f"CudaExecutor has no forward kernel for {kind!r} ({prim.path})")


def record_forward(launcher, ctx, op):
    ov = _OpView(ctx, op, ctx.plan.arch.layers[op.layer])
    values, steps = {}, []
    keep = {v for v, tid in _values_written(ov).items() if ctx.plan.tensor(tid).region == "saved"}
    keep.add(ov.layer.output)
    for position, prim in ov.prims:
        inputs = [values[v] if v in values else ov.read(ov.tag(position) + role)
                  for role, v in zip(input_roles(prim), prim.inputs)]
        out = ov.written(ov.tag(position) + "y")
        values[prim.output] = out
        steps.append(_Step(position, prim, inputs, out))
    _run_chain(launcher, ov, steps, "train" if op.attr("training") else "eval", keep)


def _values_written(ov):
    return {prim.output: ov.op.written(ov.tag(position) + "y") for position, prim in ov.prims}


# ---- loss and optimizer ----------------------------------------------------------------------------------
def record_loss(launcher, ctx, op):
    logits, labels = ctx.views[op.read("logits")], ctx.views[op.read("labels")]
    dlogits_tid = op.written("dlogits")
    dlogits = None if dlogits_tid is None else ctx.views[dlogits_tid]
    _loss.softmax_cross_entropy(launcher, logits, labels, ctx.smoothing, ctx.views[op.written("loss")], dlogits,
                                None if dlogits is None else ctx.scalars["loss_scale"])
    _loss.count_correct(launcher, logits, labels, ctx.views[op.written("correct")])


def record_optimizer(launcher, ctx, op):
    """Overflow check, one multi-tensor update over the whole parameter region (skipped on
    overflow), the loss-scale update, the counters, and the fp16 weight copies."""
    from blueprint.optim import SGD, AdamW

    s, r, opt = ctx.scalars, ctx.regions, ctx.optimizer
    _optim.check_overflow(launcher, r["grads"], s["overflow"])
    count = r["params"].size
    if isinstance(opt, SGD):
        buf = r["optim"][:count] if opt.state_slots else r["grads"]   # never touched without momentum
        _optim.sgd_step(launcher, r["params"], r["grads"], buf, s["lr"], s["step"], s["loss_scale"], s["overflow"],
                        opt.momentum_factor, opt.dampening_factor, opt.use_nesterov, opt.weight_decay_factor)
    else:
        _optim.adam_step(launcher, r["params"], r["grads"], r["optim"][:count], r["optim"][count:2 * count], s["lr"],
                         s["step"], s["loss_scale"], s["overflow"], opt.beta1, opt.beta2, opt.epsilon,
                         opt.weight_decay_factor, isinstance(opt, AdamW))
    _optim.update_loss_scale(launcher, s["overflow"], s["loss_scale"], s["good_steps"])
    _optim.advance_counters(launcher, s["overflow"], s["step"], s["iteration"])
    _elementwise.cast_f32_to_f16(launcher, r["params"], r["weights16"])


# ---- backward --------------------------------------------------------------------------------------------
class _Gradients:
    """Where each value's gradient goes inside one backward op, and whether to add into it."""

    def __init__(self, ov):
        self.ov = ov
        self.written = set()

    def of_output(self, value):
        ov = self.ov
        return ov.read("dy") if value == ov.layer.output else ov.written(f"grad{value}")

    def target(self, value, role=None):
        """(view or None, accumulate) for the gradient of ``value``; ``role`` for unfused ops."""
        ov = self.ov
        if ov.fused:
            if value in ov.layer.inputs:
                role = f"dx{ov.layer.inputs.index(value)}"
                base = bool(ov.op.attr("accumulate_" + role, False))
            else:
                role, base = f"grad{value}", False
        else:
            base = bool(ov.op.attr("accumulate_" + role, False))
        tid = ov.op.written(role)
        if tid is None:
            return None, False
        accumulate = base or tid in self.written
        self.written.add(tid)
        return ov.ctx.views[tid], accumulate


def _forward_values(ov):
    """Values the backward can read: saved ones, and (fused) the recompute workspaces."""
    values, recompute = {}, {}
    if ov.fused:
        for role, tid in ov.op.reads:
            if role.startswith("saved"):
                values[int(role[len("saved"):])] = ov.ctx.views[tid]
        for role, tid in ov.op.writes:
            if role.startswith("recompute"):
                recompute[int(role[len("recompute"):])] = ov.ctx.views[tid]
    else:
        prim = ov.prims[0][1]
        for role, value in (("x", prim.inputs[0]), ("y", prim.output)):
            if ov.read(role) is not None:
                values[value] = ov.read(role)
    return values, recompute


def _needed_values(ov):
    needed = set()
    for _, prim in ov.prims:
        reads = BACKWARD_READS.get(prim.kind)
        if reads == "in":
            needed.add(prim.inputs[0])
        elif reads == "out":
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
        _backward_primitive(launcher, ov, grads, values, position, prim)


def _backward_primitive(launcher, ov, grads, values, position, prim):
    kind, tag = prim.kind, ov.tag(position)
    dy = grads.of_output(prim.output)

    def dparam(suffix):
        return ov.written(tag + "d" + suffix)

    if kind == "add":
        for role, value in zip(("da", "db"), prim.inputs):
            target, accumulate = grads.target(value, role)
            if target is not None:
                _elementwise.accumulate_into(launcher, target, dy, accumulate)
        return
    if kind == "channel_mul":   # unfused only: its inputs are read by role
        (dx, accumulate_dx), (ds, accumulate_ds) = grads.target(prim.inputs[0], "dx"), grads.target(prim.inputs[1], "ds")
        _channel_mul.channel_mul_backward(launcher, ov.read("x"), ov.read("s"), dy, dx, ds, accumulate_dx,
                                          accumulate_ds)
        return
    dx, accumulate = grads.target(prim.inputs[0], "dx")
    if kind == "conv":
        ov.ctx.gemm.conv2d_backward(launcher, values[prim.inputs[0]], ov.param(position, "weight", half=True), dy,
                                    dx, dparam("weight"), prim.param("stride"), prim.param("padding"),
                                    prim.param("groups"), accumulate)
    elif kind == "fc":
        x = values[prim.inputs[0]]
        ov.ctx.gemm.linear_backward(launcher, as_2d(x), ov.param(position, "weight", half=True), dy,
                                    None if dx is None else as_2d(dx), dparam("weight"), dparam("bias"), accumulate)
    elif kind in BATCHNORM:
        saved = ov.read(tag + "save_mean"), ov.read(tag + "save_invstd")
        _batchnorm.batchnorm_backward(launcher, as_2d(values[prim.inputs[0]]), ov.param(position, "weight"), *saved,
                                      as_2d(dy), None if dx is None else as_2d(dx), dparam("weight"), dparam("bias"),
                                      accumulate)
    elif dx is None:
        return
    elif kind in _ACTIVATION_CODES:
        saved = values[prim.output if BACKWARD_READS[kind] == "out" else prim.inputs[0]]
        _elementwise.activation_backward(launcher, activation_code(kind), saved, dy, dx, prim.param("slope", 0.01),
                                         accumulate)
    elif kind == "gap":
        _pool.gap_backward(launcher, dy, dx, accumulate)
    elif kind == "flatten":
        _elementwise.accumulate_into(launcher, dx, dy.reshape(dx.shape), accumulate)
    elif kind == "maxpool":
        _pool.maxpool_backward(launcher, ov.read(tag + "argmax"), dy, dx, prim.param("kernel"), prim.param("stride"),
                               prim.param("padding"), accumulate)
    elif kind == "avgpool":
        _pool.avgpool_backward(launcher, dy, dx, prim.param("kernel"), prim.param("stride"), prim.param("padding"),
                               accumulate)
    elif kind == "channel_pad":
        _elementwise.channel_pad_backward(launcher, dy, dx, accumulate)
    elif kind == "dropout":
        _elementwise.dropout_backward(launcher, ov.read(tag + "mask"), dy, dx, prim.param("p"), accumulate)
    elif kind == "drop_path":
        _drop_path.drop_path_backward(launcher, ov.read(tag + "mask"), dy, dx, prim.param("p"), accumulate)
    else:
        raise NotImplementedError(f"CudaExecutor has no backward kernel for {kind!r} ({prim.path})")


def record_op(launcher, ctx, op):
    if op.direction == "forward":
        record_forward(launcher, ctx, op)
    elif op.direction == "loss":
        record_loss(launcher, ctx, op)
    elif op.direction == "backward":
        record_backward(launcher, ctx, op)
    else:
        record_optimizer(launcher, ctx, op)
