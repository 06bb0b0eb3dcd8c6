"""`CpuExecutor`: runs a CompiledPlan (fuse=False, fp32) with numba kernels inside one numpy arena.

Every tensor is a view at its planned offset, made once per variant; a step allocates
nothing but the few bytes of its Python bookkeeping. With `separate_buffers=True` every
saved and transient tensor gets its own array instead: both modes must give bit-identical
results, which checks the memory plan on any machine.

In an eval graph, a convolution followed by BatchNorm (and then optionally the residual add and ReLU) runs
the chain as its epilogue (`cpu_ref._epilogue`), block by block while its output is in cache, when no other
op reads the intermediate values (`_find_chains`; where the plan put the chain's output over memory the
convolution still reads, one copy moves the result there afterwards). The result is bit-identical to the
kernels run one by one (``eval_epilogues=False``); the chain's intermediate tensors are then not written.
Likewise, in a training graph, BatchNorm followed by the residual add and/or ReLU whose intermediate values no
other op reads (forward or backward: ReLU's backward reads its output) runs as one pass
(`_find_train_chains`, ``train_epilogues=False`` for op by op).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from blueprint.optim import SGD, Adam, AdamW
from cpu_ref import kernels as K
from planner import arena_budget
from planner.executor_api import ExecutorBase, FinishedStep, InputError, dropout_seed, step_result
from planner.init import initial_parameters
from planner.memory import lifetimes
from planner.ops import Prim, activation_params
from planner.plan import Role

from cpu_ref._table import CPU



class CpuExecutor(ExecutorBase):
    """Train and evaluate a CompiledPlan on the CPU.

    ``separate_buffers=True`` gives every tensor its own array instead of its place in the arena (the results
    are bit-identical: a check of the memory plan). ``eval_epilogues=False`` runs an eval graph's
    ``conv -> bn [-> add] [-> relu]`` chains op by op instead of as the convolution's epilogue, and
    ``train_epilogues=False`` a training graph's ``bn -> add``, ``bn -> relu`` and ``bn -> add -> relu`` chains
    instead of in BatchNorm's pass: the same bits, slower, and every intermediate tensor written (for inspecting
    them while debugging).

    >>> from blueprint import zoo
    >>> from planner import ArchPlan
    >>> from planner.compiler import Compiler
    >>> plan = Compiler(ArchPlan.from_blueprint(zoo.mlp([4, 8, 3]), in_channels=4)).compile(
    ...     {"train": (2, 1, 1, 4), "eval": (2, 1, 1, 4)})
    >>> ex = CpuExecutor(plan, seed=0)
    >>> ex.forward(np.ones((2, 1, 1, 4), np.float32)).shape
    (2, 3)
    """

    def __init__(self, plan, loss=None, optimizer=None, seed: int = 0, separate_buffers: bool = False,
                 eval_epilogues: bool = True, train_epilogues: bool = True):
        if plan.arch.fuse or plan.arch.amp:
            raise ValueError("CpuExecutor runs fp32 unfused plans: build the ArchPlan with fuse=False, amp=False "
                             "(fused fp16 plans run on CudaExecutor)")
        CPU.check_plan(plan)
        super().__init__(plan, loss, optimizer, seed)
        arena_budget.check_arena_fits(plan, arena_budget.host_available_bytes(), "host")
        self.arena = np.zeros(plan.memory.arena_bytes, dtype=np.uint8)
        self._separate = separate_buffers
        self._eval_epilogues = eval_epilogues
        self._train_epilogues = train_epilogues
        self.threaded_linear = threaded_linear(plan)
        self._chains: dict[tuple[str, str], dict[int, _Chain | _TrainChain | None]] = {}
        self._views: dict[str, dict[int, np.ndarray]] = {}
        self._persistent = {t.id: self._view(t, t.shape) for t in plan.tensors if not t.graph}
        self._regions = {name: self._region_view(name) for name in ("params", "grads", "optim")}
        self.batchnorm_sums = K.local_channel_sums   # sync BN (blueprint.distributed) sums over every replica
        for tid, value in initial_parameters(plan, seed).items():
            self._write(tid, value)

    def _read(self, tid: int) -> np.ndarray:
        return self._persistent[tid].copy()

    def _write(self, tid: int, value) -> None:
        self._persistent[tid][...] = value

    # ---- views -------------------------------------------------------------------------------------
    def _view(self, t, shape) -> np.ndarray:
        if self._separate and t.graph:
            return np.zeros(shape, dtype=t.dtype)
        count = math.prod(shape)
        return self.arena[t.offset:t.offset + count * np.dtype(t.dtype).itemsize].view(t.dtype).reshape(shape)

    def _region_view(self, region: str) -> np.ndarray:
        start, nbytes = self.plan.memory.regions[region]
        return self.arena[start:start + nbytes].view(np.float32)

    def _variant_views(self, variant: str) -> dict[int, np.ndarray]:
        if variant not in self._views:
            views = dict(self._persistent)
            for t in self.plan.tensors:
                if t.graph == self.plan.variants[variant].graph or t.region == "io":
                    views[t.id] = self._view(t, t.shape_in(variant))
            self._views[variant] = views
        return self._views[variant]

    # ---- the steps (checks, variant choice and bookkeeping: ExecutorBase) ---------------------------------
    def _forward(self, variant, graph, x):
        views = self._load_batch(variant, x, None)
        self._run_schedule(graph, views, self._runner(views, variant, graph), forward_only=True)
        return views[self.plan.io["logits"]]

    def _evaluate(self, variant, x, y):
        views = self._load_batch(variant, x, y)
        self._run_schedule("eval", views, self._runner(views, variant, "eval"))
        io = self.plan.io
        return views[io["loss"]], views[io["correct"]], views[io["logits"]]

    def _train(self, variant, x, y, lr):
        self._lr = lr
        views = self._load_batch(variant, x, y)
        self._run_schedule("train", views, self._runner(views, variant, "train"))
        return FinishedStep(*step_result(views[self.plan.io["loss"]], views[self.plan.io["correct"]]))

    def _load_batch(self, variant, x, y):
        views = self._variant_views(variant)
        views[self.plan.io["input"]][...] = x
        if y is not None:
            views[self.plan.io["labels"]][...] = y
        return views

    # ---- chains: the eval graph's convolution epilogues, the training graph's BatchNorm ones ---------------
    def _op_chains(self, variant, graph, views) -> dict:
        """Op index -> its `_Chain` (a convolution that runs one, in an eval graph) or `_TrainChain` (a BatchNorm,
        in a training graph), or None (an op a chain absorbed); empty with ``eval_epilogues=False`` or
        ``train_epilogues=False`` for the graph's kind. Found once per (variant, graph)."""
        key = (variant, graph)
        if key not in self._chains:
            train = graph == "train"
            find = _find_train_chains if train else _find_chains
            self._chains[key] = find(self.plan, graph, views) if (
                self._train_epilogues if train else self._eval_epilogues) else {}
        return self._chains[key]

    def _runner(self, views, variant, graph):
        """``run_op`` for `_run_schedule`: `_run`, except that a chain's first op runs the chain and the ops
        it absorbed are skipped."""
        chains = self._op_chains(variant, graph, views)
        if not chains:
            return lambda op: self._run(op, views, variant)

        def run_op(op):
            if op.index not in chains:
                self._run(op, views, variant)
            elif chains[op.index] is not None:
                chain = chains[op.index]
                run = _bn_train_chain if type(chain) is _TrainChain else _conv_fwd_chain
                run(self, self.plan.arch.layers[op.layer], op, views, chain)
        return run_op

    # ---- op dispatch -----------------------------------------------------------------------------------
    def _run(self, op, views, variant):
        if op.direction == "optimizer":
            return self._optimizer_update(views)
        layer = self.plan.arch.layers[op.layer]
        CPU.lookup(layer.kind, op.direction, layer.path)(self, layer, op, views)

    def _optimizer_update(self, views):
        update = OPTIMIZER_UPDATES.get(type(self.optimizer))
        if update is None:
            raise TypeError(f"CpuExecutor: no update for the optimizer {type(self.optimizer).__name__}; expected one "
                            f"of {sorted(t.__name__ for t in OPTIMIZER_UPDATES)} "
                            f"(cpu_ref/_executor.py OPTIMIZER_UPDATES)")
        update(self, self._regions["params"], self._regions["grads"], self._regions["optim"])


#: Share of a plan's multiply-adds in its fully connected layers from which they run on numpy's multi-threaded BLAS
#: rather than partitioned on numba's pool (`cpu_ref._linear`'s header). An MLP spends nearly all its step in them
#: and gains from OpenBLAS's own threading: the 784-1024-512-256-10 step at batch 128, 2 threads, took 6.3-6.6 ms
#: threaded against 6.7-6.9 partitioned (AVX-512), 6.1-6.3 against 7.0-8.8 with OpenBLAS's Haswell kernels. A
#: network of convolutions (resnet50: 0.05% of its multiply-adds in its ``fc``) loses more to the idle BLAS workers
#: spinning beside numba's threads: its eval forward at batch 8 took 446-489 ms threaded, 398-419 partitioned
#: (medians of steps, each version in its own processes, alternated; benchmarks/RESULTS.md).
THREADED_LINEAR_SHARE = 0.5


def threaded_linear(plan) -> bool:
    """Whether ``plan``'s fully connected layers run threaded (``THREADED_LINEAR_SHARE``): a rule of the plan, the
    same on every run."""
    total = sum(plan.macs_per_sample.values())
    linear = sum(macs for position, macs in plan.macs_per_sample.items() if plan.primitives[position].kind == Prim.FC)
    return total > 0 and linear >= THREADED_LINEAR_SHARE * total


def _sgd_update(ex, params, grads, state):
    opt = ex.optimizer
    buf = state[:params.size] if opt.state_slots else np.zeros(0, np.float32)
    K.sgd_step(params, grads, buf, ex._lr, opt.momentum_factor, opt.dampening_factor, opt.use_nesterov,
               opt.weight_decay_factor, ex.step_count == 0)


def _adam_update(ex, params, grads, state):
    opt, count = ex.optimizer, params.size
    K.adam_step(params, grads, state[:count], state[count:2 * count], ex._lr, opt.beta1, opt.beta2, opt.epsilon,
                opt.weight_decay_factor, ex.step_count + 1, opt.decoupled)


#: the optimizer configuration's type -> its update over the whole parameter region
OPTIMIZER_UPDATES = {SGD: _sgd_update, Adam: _adam_update, AdamW: _adam_update}


def _v(op, views, role, write=False):
    tid = op.written(role) if write else op.read(role)
    return None if tid is None else views[tid]


def _as2d(array):
    return array.reshape(-1, array.shape[-1])


# handlers, registered in the CPU kernel table: (executor, layer, op, views)
@CPU.implements(Prim.SOFTMAX_CE, "loss")
def _loss(ex, layer, op, views):
    io = ex.plan.io
    logits = views[op.read(Role.LOGITS)]
    labels = views[op.read(Role.LABELS)]
    dlogits_tid = op.written(Role.DLOGITS)
    dlogits = views[dlogits_tid] if dlogits_tid is not None else None
    loss = K.softmax_cross_entropy(logits, labels, ex.loss.smoothing, dlogits, 1.0)
    views[io["loss"]][()] = loss
    views[io["correct"]][()] = int((np.argmax(logits, axis=1) == labels).sum())


@CPU.implements(Prim.CONV, "forward")
def _conv_fwd(ex, layer, op, views):
    K.conv2d_forward(_v(op, views, Role.X), _v(op, views, Role.WEIGHT), _v(op, views, Role.Y, True),
                     layer.param("stride"), layer.param("padding"), layer.param("groups"), _col(op, views),
                     op.attr("conv"))


class _Chain(NamedTuple):
    """A convolution's eval epilogue: its BatchNorm op, the residual the add joins (or None), whether ReLU
    follows, the chain's output tensor, and how the epilogue reaches it: ``"scratch"`` (the output shares no
    memory with the convolution's, whose rows then hold one block at a time), ``"in place"`` (it is the
    convolution's output) or ``"copy"`` (it overlaps what the convolution still reads: the epilogue runs in
    place in the convolution's output, which is copied to it afterwards)."""
    bn: object
    residual: int | None
    relu: bool
    out: int
    mode: str


def _bytes(array):
    start = array.__array_interface__["data"][0]
    return start, start + array.nbytes


def _overlap(a, b):
    (a0, a1), (b0, b1) = _bytes(a), _bytes(b)
    return a0 < b1 and b0 < a1


def _same(a, b):
    return _bytes(a) == _bytes(b)


def _sole_reader(plan, graph):
    """``only_input_of_next(tid, i)``: whether tensor ``tid``, written by op ``i`` of ``graph``, is no io tensor and
    no op but the next (a forward op) touches it, backward ops included."""
    ops = plan.graphs[graph].ops
    touched = lifetimes(plan.graphs[graph])   # tensor -> (first, last) op index
    io = set(plan.io.values())

    def only_input_of_next(tid, i):
        return touched.get(tid) == (i, i + 1) and tid not in io and ops[i + 1].direction == "forward"
    return only_input_of_next


def _add_relu_after(ops, only_input_of_next, out, i):
    """The residual add and then ReLU that a chain takes after op ``i`` (output ``out``), each where the value it
    reads is only its input: ``(absorbed op indices, the chain's output, the residual or None, relu)``."""
    absorbed, residual, relu, j = [], None, False, i + 1
    if only_input_of_next(out, i) and ops[j].kind == Prim.ADD.value:
        a, b = ops[j].read(Role.A), ops[j].read(Role.B)
        if out in (a, b) and a != b:
            residual = b if a == out else a
            absorbed.append(j)
            out, j = ops[j].written(Role.Y), j + 1
    if j < len(ops) and only_input_of_next(out, j - 1) and ops[j].kind == Prim.RELU.value \
            and ops[j].read(Role.X) == out:
        relu = True
        absorbed.append(j)
        out = ops[j].written(Role.Y)
    return absorbed, out, residual, relu


def _find_chains(plan, graph, views) -> dict:
    """The chains ``conv -> bn [-> add] [-> relu]`` of consecutive forward ops of an eval graph whose
    intermediate values only the next op reads, and whose output (in ``views``) is either the convolution's
    output or disjoint from it, and either the residual or disjoint from it. Its `_Chain.mode` says how the
    epilogue reaches that output."""
    ops = plan.graphs[graph].ops
    only_input_of_next = _sole_reader(plan, graph)
    chains = {}
    for i, op in enumerate(ops):
        layer = plan.arch.layers[op.layer] if op.layer >= 0 else None
        if (layer is None or op.kind != Prim.CONV.value or op.direction != "forward" or op.attr("training")
                or not K.epilogue_supported(op.attr("conv").forward, layer.param("groups"))
                or not only_input_of_next(op.written(Role.Y), i)):
            continue
        bn = ops[i + 1]
        if bn.kind != Prim.BN2D.value or bn.attr("training") or bn.read(Role.X) != op.written(Role.Y):
            continue
        tail, out, residual, relu = _add_relu_after(ops, only_input_of_next, bn.written(Role.Y), i + 1)
        absorbed = [i + 1] + tail
        y, final, x, weight = views[op.written(Role.Y)], views[out], views[op.read(Role.X)], views[op.read(Role.WEIGHT)]
        col = op.written(Role.COL)
        used = 0 if col is None else K.forward_workspace_used(x.shape, weight.shape, layer.param("stride"),
                                                              layer.param("padding"), layer.param("groups"),
                                                              op.attr("conv").forward)
        if ((residual is not None and _overlap(final, views[residual]) and not _same(final, views[residual]))
                or (_overlap(final, y) and not _same(final, y))):
            continue
        if _overlap(final, x) or (used and _overlap(final, views[col].reshape(-1)[:used])):
            mode = "copy"   # y is disjoint from both (they are live together) and, here, from the output
        else:
            mode = "in place" if _same(final, y) else "scratch"
        chains[i] = _Chain(bn, residual, relu, out, mode)
        chains.update((k, None) for k in absorbed)
    return chains


def _conv_fwd_chain(ex, layer, op, views, chain):
    bn_layer = ex.plan.arch.layers[chain.bn.layer]
    scale, shift = K.eval_scale_shift(_v(chain.bn, views, Role.WEIGHT), _v(chain.bn, views, Role.BIAS),
                                      _v(chain.bn, views, Role.RUNNING_MEAN), _v(chain.bn, views, Role.RUNNING_VAR),
                                      bn_layer.param("eps"))
    residual = views[chain.residual] if chain.residual is not None else None
    y, out = _v(op, views, Role.Y, True), views[chain.out]
    epilogue = K.Epilogue(scale, shift, _EMPTY_2D if residual is None else _as2d(residual), chain.relu,
                          _as2d(y if chain.mode == "copy" else out), chain.mode == "scratch")
    K.conv2d_forward(_v(op, views, Role.X), _v(op, views, Role.WEIGHT), y, layer.param("stride"),
                     layer.param("padding"), layer.param("groups"), _col(op, views), op.attr("conv"), epilogue)
    if chain.mode == "copy":
        K.accumulate_into(out, y, False)


_EMPTY_2D = np.zeros((0, 0), np.float32)


class _TrainChain(NamedTuple):
    """A training BatchNorm's epilogue: the residual the add joins (or None), whether ReLU follows, and the chain's
    output tensor (the last op's)."""
    residual: int | None
    relu: bool
    out: int


def _find_train_chains(plan, graph, views) -> dict:
    """The chains ``bn [-> add] [-> relu]`` (at least one of the two) of consecutive forward ops of a training graph
    whose intermediate values no other op of the graph reads, whose output is disjoint from BatchNorm's input (which
    its backward reads) and either the residual or disjoint from it."""
    ops = plan.graphs[graph].ops
    only_input_of_next = _sole_reader(plan, graph)
    chains = {}
    for i, op in enumerate(ops[:-1]):
        if op.kind != Prim.BN2D.value or op.direction != "forward" or not op.attr("training"):
            continue
        absorbed, out, residual, relu = _add_relu_after(ops, only_input_of_next, op.written(Role.Y), i)
        final = views[out]
        if not absorbed or _overlap(final, views[op.read(Role.X)]) or (
                residual is not None and _overlap(final, views[residual]) and not _same(final, views[residual])):
            continue
        chains[i] = _TrainChain(residual, relu, out)
        chains.update((k, None) for k in absorbed)
    return chains


def _bn_train_chain(ex, layer, op, views, chain):
    _bn_fwd(ex, layer, op, views, views[chain.out], _EMPTY_2D if chain.residual is None else _as2d(
        views[chain.residual]), chain.relu)


def _col(op, views):
    col = _v(op, views, Role.COL, True)
    return col if col is not None else np.zeros((0, 0), np.float32)


@CPU.implements((Prim.BN2D, Prim.BN1D), "forward")
def _bn_fwd(ex, layer, op, views, out=None, residual=_EMPTY_2D, relu=False):
    """BatchNorm's forward; with ``out`` (a training chain's output, `_bn_train_chain`), ``relu?(bn + residual)``
    into it instead of BatchNorm's output."""
    x, y = _as2d(_v(op, views, Role.X)), _as2d(_v(op, views, Role.Y, True) if out is None else out)
    gamma, beta = _v(op, views, Role.WEIGHT), _v(op, views, Role.BIAS)
    mean, var = _v(op, views, Role.RUNNING_MEAN), _v(op, views, Role.RUNNING_VAR)
    if op.attr("training"):
        K.batchnorm_forward_train(x, gamma, beta, y, _v(op, views, Role.SAVE_MEAN, True),
                                  _v(op, views, Role.SAVE_INVSTD, True), mean, var, layer.param("momentum"),
                                  layer.param("eps"), ex.batchnorm_sums, residual, relu)
        tracked = _v(op, views, Role.NUM_BATCHES_TRACKED, True)
        tracked[()] += 1
    else:
        K.batchnorm_forward_eval(x, gamma, beta, mean, var, layer.param("eps"), y)


def _act_fwd(ex, layer, op, views):
    K.activation_forward(layer.kind, _v(op, views, Role.X).reshape(-1), _v(op, views, Role.Y, True).reshape(-1),
                         activation_params(layer))


@CPU.implements(Prim.DROPOUT, "forward")
def _dropout_fwd(ex, layer, op, views):
    x, y = _v(op, views, Role.X), _v(op, views, Role.Y, True)
    if op.attr("training") and layer.param("p") > 0:
        K.dropout_forward(x.reshape(-1), y.reshape(-1), _v(op, views, Role.MASK, True).reshape(-1), layer.param("p"),
                          dropout_seed(ex.seed, op.layer), ex.step_count)   # unfused: layer index == position
    else:
        y[...] = x
        mask = _v(op, views, Role.MASK, True)
        if mask is not None:
            mask[...] = 1


@CPU.implements(Prim.FLATTEN, "forward")
def _flatten_fwd(ex, layer, op, views):
    y = _v(op, views, Role.Y, True)
    y[...] = _v(op, views, Role.X).reshape(y.shape)


@CPU.implements(Prim.FC, "forward")
def _fc_fwd(ex, layer, op, views):
    K.linear_forward(_v(op, views, Role.X), _v(op, views, Role.WEIGHT), _v(op, views, Role.BIAS),
                     _v(op, views, Role.Y, True), ex.threaded_linear)


@CPU.implements(Prim.MAXPOOL, "forward")
def _maxpool_fwd(ex, layer, op, views):
    K.maxpool_forward(_v(op, views, Role.X), _v(op, views, Role.Y, True), _v(op, views, Role.ARGMAX, True),
                      layer.param("kernel"), layer.param("stride"), layer.param("padding"))


@CPU.implements(Prim.AVGPOOL, "forward")
def _avgpool_fwd(ex, layer, op, views):
    K.avgpool_forward(_v(op, views, Role.X), _v(op, views, Role.Y, True), layer.param("kernel"), layer.param("stride"),
                      layer.param("padding"))


@CPU.implements(Prim.GAP, "forward")
def _gap_fwd(ex, layer, op, views):
    K.gap_forward(_v(op, views, Role.X), _v(op, views, Role.Y, True))


@CPU.implements(Prim.CHANNEL_PAD, "forward")
def _channel_pad_fwd(ex, layer, op, views):
    K.channel_pad_forward(_v(op, views, Role.X), _v(op, views, Role.Y, True))


@CPU.implements(Prim.ADD, "forward")
def _add_fwd(ex, layer, op, views):
    K.add_forward(_v(op, views, Role.A), _v(op, views, Role.B), _v(op, views, Role.Y, True))


@CPU.implements(Prim.CHANNEL_MUL, "forward")
def _channel_mul_fwd(ex, layer, op, views):
    K.channel_mul_forward(_v(op, views, Role.X), _v(op, views, Role.S), _v(op, views, Role.Y, True))


@CPU.implements(Prim.DROP_PATH, "forward")
def _drop_path_fwd(ex, layer, op, views):
    x, y = _v(op, views, Role.X), _v(op, views, Role.Y, True)
    if op.attr("training"):
        K.drop_path_forward(x, y, _v(op, views, Role.MASK, True), layer.param("p"), dropout_seed(ex.seed, op.layer),
                            ex.step_count)   # unfused: layer index == position
    else:
        y[...] = x


@CPU.implements(Prim.PRELU, "forward")
def _prelu_fwd(ex, layer, op, views):
    K.prelu_forward(_v(op, views, Role.X), _v(op, views, Role.WEIGHT), _v(op, views, Role.Y, True))


# backward handlers
def _acc(op, role=Role.DX):
    """Whether the input gradient written in `role` adds onto what an earlier op wrote there."""
    operand = op.writing(role)
    return operand is not None and operand.accumulate


@CPU.implements(Prim.CONV, "backward")
def _conv_bwd(ex, layer, op, views):
    K.conv2d_backward(_v(op, views, Role.X), _v(op, views, Role.WEIGHT), _v(op, views, Role.DY),
                      _v(op, views, Role.DX, True), _v(op, views, Role.DWEIGHT, True), layer.param("stride"),
                      layer.param("padding"), layer.param("groups"), _col(op, views), _acc(op), op.attr("conv"))


@CPU.implements((Prim.BN2D, Prim.BN1D), "backward")
def _bn_bwd(ex, layer, op, views):
    dx = _v(op, views, Role.DX, True)
    K.batchnorm_backward(_as2d(_v(op, views, Role.X)), _v(op, views, Role.WEIGHT), _v(op, views, Role.SAVE_MEAN),
                         _v(op, views, Role.SAVE_INVSTD), _as2d(_v(op, views, Role.DY)),
                         None if dx is None else _as2d(dx), _v(op, views, Role.DWEIGHT, True),
                         _v(op, views, Role.DBIAS, True), _acc(op), ex.batchnorm_sums)


def _act_bwd(ex, layer, op, views):
    saved = _v(op, views, Role.Y) if _v(op, views, Role.Y) is not None else _v(op, views, Role.X)
    K.activation_backward(layer.kind, saved.reshape(-1), _v(op, views, Role.DY).reshape(-1),
                          _v(op, views, Role.DX, True).reshape(-1), activation_params(layer), _acc(op))


@CPU.implements(Prim.DROPOUT, "backward")
def _dropout_bwd(ex, layer, op, views):
    K.dropout_backward(_v(op, views, Role.MASK).reshape(-1), _v(op, views, Role.DY).reshape(-1),
                       _v(op, views, Role.DX, True).reshape(-1), layer.param("p"), _acc(op))


@CPU.implements(Prim.FLATTEN, "backward")
def _flatten_bwd(ex, layer, op, views):
    dx = _v(op, views, Role.DX, True)
    K.accumulate_into(dx, _v(op, views, Role.DY).reshape(dx.shape), _acc(op))


@CPU.implements(Prim.FC, "backward")
def _fc_bwd(ex, layer, op, views):
    K.linear_backward(_v(op, views, Role.X), _v(op, views, Role.WEIGHT), _v(op, views, Role.DY),
                      _v(op, views, Role.DX, True), _v(op, views, Role.DWEIGHT, True), _v(op, views, Role.DBIAS, True),
                      _acc(op), ex.threaded_linear)


@CPU.implements(Prim.MAXPOOL, "backward")
def _maxpool_bwd(ex, layer, op, views):
    K.maxpool_backward(_v(op, views, Role.ARGMAX), _v(op, views, Role.DY), _v(op, views, Role.DX, True), _acc(op))


@CPU.implements(Prim.AVGPOOL, "backward")
def _avgpool_bwd(ex, layer, op, views):
    K.avgpool_backward(_v(op, views, Role.DY), _v(op, views, Role.DX, True), layer.param("kernel"),
                       layer.param("stride"), layer.param("padding"), _acc(op))


@CPU.implements(Prim.GAP, "backward")
def _gap_bwd(ex, layer, op, views):
    K.gap_backward(_v(op, views, Role.DY), _v(op, views, Role.DX, True), _acc(op))


@CPU.implements(Prim.CHANNEL_PAD, "backward")
def _channel_pad_bwd(ex, layer, op, views):
    K.channel_pad_backward(_v(op, views, Role.DY), _v(op, views, Role.DX, True), _acc(op))


@CPU.implements(Prim.ADD, "backward")
def _add_bwd(ex, layer, op, views):
    dy = _v(op, views, Role.DY)
    for role in (Role.DA, Role.DB):
        target = _v(op, views, role, True)
        if target is not None:
            K.accumulate_into(target, dy, _acc(op, role))


@CPU.implements(Prim.CHANNEL_MUL, "backward")
def _channel_mul_bwd(ex, layer, op, views):
    K.channel_mul_backward(_v(op, views, Role.X), _v(op, views, Role.S), _v(op, views, Role.DY),
                           _v(op, views, Role.DX, True), _v(op, views, Role.DS, True), _acc(op, Role.DX),
                           _acc(op, Role.DS))


@CPU.implements(Prim.DROP_PATH, "backward")
def _drop_path_bwd(ex, layer, op, views):
    K.drop_path_backward(_v(op, views, Role.MASK), _v(op, views, Role.DY), _v(op, views, Role.DX, True),
                         layer.param("p"), _acc(op))


@CPU.implements(Prim.PRELU, "backward")
def _prelu_bwd(ex, layer, op, views):
    K.prelu_backward(_v(op, views, Role.X), _v(op, views, Role.WEIGHT), _v(op, views, Role.DY),
                     _v(op, views, Role.DX, True), _v(op, views, Role.DWEIGHT, True), _acc(op))


# activations: those with kernels in cpu_ref/_activation.py (a missing one fails CPU.check_plan)
for _prim in K.ACTIVATION_KERNELS:
    CPU.register(_prim, "forward", _act_fwd)
    CPU.register(_prim, "backward", _act_bwd)


__all__ = ["CpuExecutor", "InputError"]
