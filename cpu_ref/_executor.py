"""`CpuExecutor`: runs a CompiledPlan (fuse=False, fp32) with numba kernels inside one numpy arena.

Every tensor is a view at its planned offset, made once per variant; a step allocates
nothing but the few bytes of its Python bookkeeping. With `separate_buffers=True` every
saved and transient tensor gets its own array instead: both modes must give bit-identical
results, which checks the memory plan on any machine.
"""
from __future__ import annotations

import math

import numpy as np

from blueprint.optim import SGD, AdamW
from cpu_ref import kernels as K
from planner.executor_api import ExecutorBase, InputError, dropout_seed
from planner.init import initial_parameters
from planner.registry import ACTIVATION_CODE




class CpuExecutor(ExecutorBase):
    """Train and evaluate a CompiledPlan on the CPU.

    >>> from blueprint import zoo
    >>> from planner import ArchPlan
    >>> from planner.compiler import Compiler
    >>> plan = Compiler(ArchPlan.from_blueprint(zoo.mlp([4, 8, 3]), in_channels=4)).compile(
    ...     {"train": (2, 1, 1, 4), "eval": (2, 1, 1, 4)})
    >>> ex = CpuExecutor(plan, seed=0)
    >>> ex.forward(np.ones((2, 1, 1, 4), np.float32)).shape
    (2, 3)
    """

    def __init__(self, plan, loss=None, optimizer=None, seed: int = 0, separate_buffers: bool = False):
        if plan.arch.fuse or plan.arch.amp:
            raise ValueError("CpuExecutor runs fp32 unfused plans: build the ArchPlan with fuse=False, amp=False "
                             "(fused fp16 plans run on CudaExecutor)")
        super().__init__(plan, loss, optimizer, seed)
        self.arena = np.zeros(plan.memory.arena_bytes, dtype=np.uint8)
        self._separate = separate_buffers
        self._views: dict[str, dict[int, np.ndarray]] = {}
        self._persistent = {t.id: self._view(t, t.shape) for t in plan.tensors if not t.graph}
        self._regions = {name: self._region_view(name) for name in ("params", "grads", "optim")}
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

    # ---- public API ------------------------------------------------------------------------------------
    def forward(self, x: np.ndarray, train: bool = False) -> np.ndarray:
        """Logits for a batch. `train=True` runs the training forward (batch statistics, dropout,
        running-stat updates) without backward or update."""
        self._check_batch(x)
        graph = "train" if train and "train" in self.plan.graphs else "eval"
        variant = self._variant_for(x.shape, graph)
        views = self._load_batch(variant, x, None)
        for op in self.plan.graphs[graph].ops:
            if op.direction == "forward":
                self._run(op, views, variant)
        return views[self.plan.io["logits"]].copy()

    def evaluate_batch(self, x: np.ndarray, y) -> tuple[float, int, np.ndarray]:
        """(mean loss, number correct, logits) in eval mode."""
        y = self._check_batch(x, y)
        variant = self._variant_for(x.shape, "eval")
        views = self._load_batch(variant, x, y)
        for op in self.plan.graphs["eval"].ops:
            self._run(op, views, variant)
        io = self.plan.io
        return float(views[io["loss"]][()]), int(views[io["correct"]][()]), views[io["logits"]].copy()

    def train_step(self, x: np.ndarray, y, lr: float) -> float:
        """One step: forward, loss, backward, optimizer update, BN running stats. Returns the loss."""
        if not self.plan.training:
            raise ValueError("this plan was compiled with training=False; compile a train variant to train")
        y = self._check_batch(x, y)
        self._lr = self._check_lr(lr)
        variant = self._variant_for(x.shape, "train")
        views = self._load_batch(variant, x, y)
        for op in self.plan.graphs["train"].ops:
            self._run(op, views, variant)
        self.step_count += 1
        self.last_correct = int(views[self.plan.io["correct"]][()])
        return float(views[self.plan.io["loss"]][()])

    def _load_batch(self, variant, x, y):
        views = self._variant_views(variant)
        views[self.plan.io["input"]][...] = x
        if y is not None:
            views[self.plan.io["labels"]][...] = y
        return views

    # ---- op dispatch -----------------------------------------------------------------------------------
    def _run(self, op, views, variant):
        if op.direction == "optimizer":
            return self._optimizer_update(views)
        if op.direction == "loss":
            return self._loss(op, views)
        layer = self.plan.arch.layers[op.layer]
        handler = (_FORWARD if op.direction == "forward" else _BACKWARD).get(layer.kind)
        if handler is None:
            raise NotImplementedError(f"CpuExecutor has no {op.direction} kernel for layer kind {layer.kind!r} "
                                      f"({layer.path})")
        handler(self, layer, op, views)

    def _loss(self, op, views):
        io = self.plan.io
        logits = views[op.read("logits")]
        labels = views[op.read("labels")]
        dlogits_tid = op.written("dlogits")
        dlogits = views[dlogits_tid] if dlogits_tid is not None else None
        loss = K.softmax_cross_entropy(logits, labels, self.loss.smoothing, dlogits, 1.0)
        views[io["loss"]][()] = loss
        views[io["correct"]][()] = int((np.argmax(logits, axis=1) == labels).sum())

    def _optimizer_update(self, views):
        opt = self.optimizer
        params, grads = self._regions["params"], self._regions["grads"]
        state = self._regions["optim"]
        count = params.size
        if isinstance(opt, SGD):
            buf = state[:count] if opt.state_slots else np.zeros(0, np.float32)
            K.sgd_step(params, grads, buf, self._lr, opt.momentum_factor, opt.dampening_factor, opt.use_nesterov,
                       opt.weight_decay_factor, self.step_count == 0)
        else:
            K.adam_step(params, grads, state[:count], state[count:2 * count], self._lr, opt.beta1, opt.beta2,
                        opt.epsilon, opt.weight_decay_factor, self.step_count + 1, isinstance(opt, AdamW))


def _v(op, views, role, write=False):
    tid = op.written(role) if write else op.read(role)
    return None if tid is None else views[tid]


def _as2d(array):
    return array.reshape(-1, array.shape[-1])


# forward handlers: (executor, layer, op, views)
def _conv_fwd(ex, layer, op, views):
    K.conv2d_forward(_v(op, views, "x"), _v(op, views, "weight"), _v(op, views, "y", True), layer.param("stride"),
                     layer.param("padding"), layer.param("groups"), _col(op, views))


def _col(op, views):
    col = _v(op, views, "col", True)
    return col if col is not None else np.zeros((0, 0), np.float32)


def _bn_fwd(ex, layer, op, views):
    x, y = _as2d(_v(op, views, "x")), _as2d(_v(op, views, "y", True))
    gamma, beta = _v(op, views, "weight"), _v(op, views, "bias")
    mean, var = _v(op, views, "running_mean"), _v(op, views, "running_var")
    if op.attr("training"):
        K.batchnorm_forward_train(x, gamma, beta, y, _v(op, views, "save_mean", True),
                                  _v(op, views, "save_invstd", True), mean, var, layer.param("momentum"),
                                  layer.param("eps"))
        tracked = _v(op, views, "num_batches_tracked", True)
        tracked[()] += 1
    else:
        K.batchnorm_forward_eval(x, gamma, beta, mean, var, layer.param("eps"), y)


def _act_fwd(ex, layer, op, views):
    K.activation_forward(ACTIVATION_CODE[layer.kind], _v(op, views, "x").reshape(-1),
                         _v(op, views, "y", True).reshape(-1), float(layer.param("slope", 0.0)))


def _dropout_fwd(ex, layer, op, views):
    x, y = _v(op, views, "x"), _v(op, views, "y", True)
    if op.attr("training") and layer.param("p") > 0:
        K.dropout_forward(x.reshape(-1), y.reshape(-1), _v(op, views, "mask", True).reshape(-1), layer.param("p"),
                          dropout_seed(ex.seed, op.layer), ex.step_count)   # unfused: layer index == position
    else:
        y[...] = x
        mask = _v(op, views, "mask", True)
        if mask is not None:
            mask[...] = 1


def _flatten_fwd(ex, layer, op, views):
    y = _v(op, views, "y", True)
    y[...] = _v(op, views, "x").reshape(y.shape)


def _fc_fwd(ex, layer, op, views):
    K.linear_forward(_v(op, views, "x"), _v(op, views, "weight"), _v(op, views, "bias"), _v(op, views, "y", True))


def _maxpool_fwd(ex, layer, op, views):
    K.maxpool_forward(_v(op, views, "x"), _v(op, views, "y", True), _v(op, views, "argmax", True),
                      layer.param("kernel"), layer.param("stride"), layer.param("padding"))


def _avgpool_fwd(ex, layer, op, views):
    K.avgpool_forward(_v(op, views, "x"), _v(op, views, "y", True), layer.param("kernel"), layer.param("stride"),
                      layer.param("padding"))


def _gap_fwd(ex, layer, op, views):
    K.gap_forward(_v(op, views, "x"), _v(op, views, "y", True))


def _channel_pad_fwd(ex, layer, op, views):
    K.channel_pad_forward(_v(op, views, "x"), _v(op, views, "y", True))


def _add_fwd(ex, layer, op, views):
    K.add_forward(_v(op, views, "a"), _v(op, views, "b"), _v(op, views, "y", True))


def _channel_mul_fwd(ex, layer, op, views):
    K.channel_mul_forward(_v(op, views, "x"), _v(op, views, "s"), _v(op, views, "y", True))


def _drop_path_fwd(ex, layer, op, views):
    x, y = _v(op, views, "x"), _v(op, views, "y", True)
    if op.attr("training"):
        K.drop_path_forward(x, y, _v(op, views, "mask", True), layer.param("p"), dropout_seed(ex.seed, op.layer),
                            ex.step_count)   # unfused: layer index == position
    else:
        y[...] = x


# backward handlers
def _acc(op, role="dx"):
    return bool(op.attr("accumulate_" + role, False))


def _conv_bwd(ex, layer, op, views):
    K.conv2d_backward(_v(op, views, "x"), _v(op, views, "weight"), _v(op, views, "dy"), _v(op, views, "dx", True),
                      _v(op, views, "dweight", True), layer.param("stride"), layer.param("padding"),
                      layer.param("groups"), _col(op, views), _acc(op))


def _bn_bwd(ex, layer, op, views):
    dx = _v(op, views, "dx", True)
    K.batchnorm_backward(_as2d(_v(op, views, "x")), _v(op, views, "weight"), _v(op, views, "save_mean"),
                         _v(op, views, "save_invstd"), _as2d(_v(op, views, "dy")), None if dx is None else _as2d(dx),
                         _v(op, views, "dweight", True), _v(op, views, "dbias", True), _acc(op))


def _act_bwd(ex, layer, op, views):
    saved = _v(op, views, "y") if _v(op, views, "y") is not None else _v(op, views, "x")
    K.activation_backward(ACTIVATION_CODE[layer.kind], saved.reshape(-1), _v(op, views, "dy").reshape(-1),
                          _v(op, views, "dx", True).reshape(-1), float(layer.param("slope", 0.0)), _acc(op))


def _dropout_bwd(ex, layer, op, views):
    K.dropout_backward(_v(op, views, "mask").reshape(-1), _v(op, views, "dy").reshape(-1),
                       _v(op, views, "dx", True).reshape(-1), layer.param("p"), _acc(op))


def _flatten_bwd(ex, layer, op, views):
    dx = _v(op, views, "dx", True)
    K.accumulate_into(dx, _v(op, views, "dy").reshape(dx.shape), _acc(op))


def _fc_bwd(ex, layer, op, views):
    K.linear_backward(_v(op, views, "x"), _v(op, views, "weight"), _v(op, views, "dy"), _v(op, views, "dx", True),
                      _v(op, views, "dweight", True), _v(op, views, "dbias", True), _acc(op))


def _maxpool_bwd(ex, layer, op, views):
    K.maxpool_backward(_v(op, views, "argmax"), _v(op, views, "dy"), _v(op, views, "dx", True), _acc(op))


def _avgpool_bwd(ex, layer, op, views):
    K.avgpool_backward(_v(op, views, "dy"), _v(op, views, "dx", True), layer.param("kernel"), layer.param("stride"),
                       layer.param("padding"), _acc(op))


def _gap_bwd(ex, layer, op, views):
    K.gap_backward(_v(op, views, "dy"), _v(op, views, "dx", True), _acc(op))


def _channel_pad_bwd(ex, layer, op, views):
    K.channel_pad_backward(_v(op, views, "dy"), _v(op, views, "dx", True), _acc(op))


def _add_bwd(ex, layer, op, views):
    dy = _v(op, views, "dy")
    for role in ("da", "db"):
        target = _v(op, views, role, True)
        if target is not None:
            K.accumulate_into(target, dy, _acc(op, role))


def _channel_mul_bwd(ex, layer, op, views):
    K.channel_mul_backward(_v(op, views, "x"), _v(op, views, "s"), _v(op, views, "dy"), _v(op, views, "dx", True),
                           _v(op, views, "ds", True), _acc(op, "dx"), _acc(op, "ds"))


def _drop_path_bwd(ex, layer, op, views):
    K.drop_path_backward(_v(op, views, "mask"), _v(op, views, "dy"), _v(op, views, "dx", True), layer.param("p"),
                         _acc(op))


_ACTS = ("relu", "relu6", "leaky_relu", "sigmoid", "tanh", "silu", "hardswish", "gelu", "hardsigmoid")
_FORWARD = {"conv": _conv_fwd, "bn2d": _bn_fwd, "bn1d": _bn_fwd, "dropout": _dropout_fwd, "flatten": _flatten_fwd,
            "fc": _fc_fwd, "maxpool": _maxpool_fwd, "avgpool": _avgpool_fwd, "gap": _gap_fwd,
            "channel_pad": _channel_pad_fwd, "add": _add_fwd, **{a: _act_fwd for a in _ACTS},
            "channel_mul": _channel_mul_fwd, "drop_path": _drop_path_fwd}
_BACKWARD = {"conv": _conv_bwd, "bn2d": _bn_bwd, "bn1d": _bn_bwd, "dropout": _dropout_bwd, "flatten": _flatten_bwd,
             "fc": _fc_bwd, "maxpool": _maxpool_bwd, "avgpool": _avgpool_bwd, "gap": _gap_bwd,
             "channel_pad": _channel_pad_bwd, "add": _add_bwd, **{a: _act_bwd for a in _ACTS},
             "channel_mul": _channel_mul_bwd, "drop_path": _drop_path_bwd}


__all__ = ["CpuExecutor", "InputError"]
