"""What every executor of a CompiledPlan shares: the step skeleton (input checks, variant
choice, the op schedule in order, step count, results), and the state of a model by name in
PyTorch layouts (parameters, gradients, optimizer state).

An executor (`cpu_ref.CpuExecutor`, `cuda_kernels.CudaExecutor`) subclasses `ExecutorBase`
and supplies only memory access and kernel calls:

- `_read(tensor_id) -> np.ndarray` (a host copy) and `_write(tensor_id, value)`, in the
  planner's internal layouts;
- `_forward(variant, graph, x) -> logits`, `_evaluate(variant, x, y) -> (loss, correct, logits)`
  and `_train(variant, x, y, lr) -> step` (``step.result()`` gives ``(loss, correct)``): load the
  batch into the variant's memory and run its ops, each op through `_run_schedule`, which walks
  the graph in schedule order and calls `_after_backward` between the last backward op and the
  optimizer op.

The CPU path runs each op at once; the CUDA path records the ops on a launch tape once per
(variant, purpose) and replays it, so there `_run_schedule` runs while recording.
"""
from __future__ import annotations

import functools
import math
import threading
from typing import NamedTuple

import numpy as np

from planner.init import from_torch_layout, to_torch_layout, torch_shape


def dropout_seed(seed: int, position: int) -> int:
    """The dropout stream of the primitive at ``position`` in ``plan.primitives``: the same on every
    path and in the fused and unfused plans of one BluePrint (fusion never reorders primitives)."""
    return seed * 1_000_003 + position


class InputError(ValueError):
    """A batch the plan cannot run: wrong shape/dtype, labels out of range, NaN/Inf values."""


WEIGHTS_FIX = ("load weights of the same architecture: this model's own state_dict(), or PyTorch weights with "
               "these keys and shapes, e.g. torchvision's for the zoo model of that name with the same num_classes")
OPTIMIZER_FIX = "load an optimizer state saved by an executor of the same model and optimizer"


class StateError(KeyError, ValueError):
    """Weights or optimizer state that cannot be loaded into this plan; nothing was written.
    (A KeyError for compatibility with earlier releases; a ValueError as every user error.)"""

    def __str__(self) -> str:   # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


STEP_KEY = "step"
AMP_PREFIX = "amp."     # the CUDA executor's loss-scale counters in its optimizer state
LISTED = 10             # names listed per problem in an error message


class _Problems:
    """Every problem found while validating a state dict, reported together in one line."""

    def __init__(self):
        self.found: list[str] = []

    def add(self, problem: str) -> None:
        self.found.append(problem)

    def keys(self, missing: list[str], unexpected: list[str]) -> None:
        for label, names in (("missing keys", missing), ("unexpected keys", unexpected)):
            if names:
                self.add(f"{label} {names[:LISTED]}{' ...' if len(names) > LISTED else ''}")

    def check_array(self, name: str, array: np.ndarray, shape: tuple, kinds: tuple[str, ...]) -> bool:
        if array.dtype.kind not in kinds:
            self.add(f"{name}: expected a {'floating' if kinds == ('f',) else 'real numeric'} array, got {array.dtype}")
        elif tuple(array.shape) != tuple(shape):
            self.add(f"mis-shaped keys {name}: expected {tuple(shape)}, got {tuple(array.shape)}")
        elif array.dtype.kind == "f" and not np.isfinite(array).all():
            self.add(f"{name}: holds {int(array.size - np.isfinite(array).sum())} NaN/Inf value(s)")
        else:
            return True
        return False

    def raise_if_any(self, where: str, fix: str) -> None:
        if self.found:
            shown = self.found[:LISTED] + ([f"... {len(self.found) - LISTED} more"] if len(self.found) > LISTED else [])
            raise StateError(f"{where}: " + "; ".join(shown) + f" (nothing was loaded; {fix})")


def step_result(loss, correct) -> tuple[float, int]:
    """``(loss, number correct)`` from the one-element arrays (or 0-d views) a step writes them to."""
    return float(np.asarray(loss).reshape(-1)[0]), int(np.asarray(correct).reshape(-1)[0])


class FinishedStep(NamedTuple):
    """A training step that has already run: the synchronous executors' answer to `submit_train_step`."""
    loss: float
    correct: int

    def result(self) -> tuple[float, int]:
        return self.loss, self.correct


def keep_local_gradients(executor, launcher=None) -> None:
    """The gradient reduction of a single process: the gradients are already the batch's."""


def serialised(method):
    """Run `method` holding the executor's lock: one arena serves one call at a time, so threads sharing an
    executor (or a `Model`) take turns instead of overwriting each other's activations."""
    @functools.wraps(method)
    def holding_the_arena(self, *args, **kwargs):
        with self.__dict__.setdefault("_arena_lock", threading.RLock()):   # setdefault is atomic
            return method(self, *args, **kwargs)
    return holding_the_arena


class ExecutorBase:
    #: Called by `_after_backward`, between the last backward op and the optimizer; a data-parallel
    #: replica (`blueprint.distributed`) replaces it with the all-reduce over its gradient region (the
    #: CUDA path records its NCCL all-reduce in the tape instead, `cuda_kernels.collective`).
    gradient_reduction = staticmethod(keep_local_gradients)

    def __init__(self, plan, loss, optimizer, seed: int):
        from blueprint.optim import SGD, CrossEntropyLoss

        self.plan = plan
        self.loss = loss if loss is not None else CrossEntropyLoss()
        self.optimizer = (optimizer if optimizer is not None else SGD()).validate()
        if plan.training and self.optimizer.state_slots > plan.optimizer_state_slots:
            raise ValueError(f"the optimizer {self.optimizer!r} needs {self.optimizer.state_slots} state slot(s) but "
                             f"the plan was compiled with optimizer_state_slots={plan.optimizer_state_slots}")
        self.seed = seed
        self.step_count = 0
        self.last_correct = 0
        self._param_by_name = {p.name: p for p in plan.params}
        self.classes = plan.value_shapes[next(iter(plan.variants))][plan.arch.output_value][1]

    # ---- memory accessors (subclasses) -----------------------------------------------------------------
    def _read(self, tid: int) -> np.ndarray:
        raise NotImplementedError

    def _write(self, tid: int, value: np.ndarray) -> None:
        raise NotImplementedError

    # ---- what each path supplies: its kernels over its memory (see the module docstring) ----------------
    def _forward(self, variant: str, graph: str, x: np.ndarray):
        raise NotImplementedError

    def _evaluate(self, variant: str, x: np.ndarray, y: np.ndarray):
        raise NotImplementedError

    def _train(self, variant: str, x: np.ndarray, y: np.ndarray, lr: float):
        raise NotImplementedError

    def _after_backward(self, views, tape=None) -> None:
        """Called once per training step between the last backward op and the optimizer op, when the
        gradient region (``self._regions["grads"]``) holds the step's gradients and nothing has read them
        yet: the point for a data-parallel all-reduce or any other gradient hook.

        The CPU path calls it during every step (``tape`` is None). The CUDA path calls it once, while
        the step is recorded, with the launch ``tape``: what it records there runs on the step's stream
        in every replay (and inside the captured CUDA graph); its gradients are loss-scaled.
        Here it calls ``gradient_reduction`` (a no-op in a single process)."""
        self.gradient_reduction(self, tape)

    def _run_schedule(self, graph: str, views, run_op, forward_only: bool = False, tape=None) -> None:
        """``run_op(op)`` for each op of ``graph`` in schedule order (only the forward ops with
        ``forward_only``), with `_after_backward` before the optimizer op."""
        for op in self.plan.graphs[graph].ops:
            if forward_only and op.direction != "forward":
                continue
            if op.direction == "optimizer":
                self._after_backward(views, tape)
            run_op(op)

    # ---- steps -----------------------------------------------------------------------------------------
    @serialised
    def forward(self, x: np.ndarray, train: bool = False) -> np.ndarray:
        """Logits (float32) for a batch. `train=True` runs the training forward (batch statistics,
        dropout, running-stat updates) without backward or update."""
        self._check_batch(x)
        graph = "train" if train and "train" in self.plan.graphs else "eval"
        variant = self._variant_for(x.shape, graph)
        return self._forward(variant, graph, x).astype(np.float32)

    @serialised
    def evaluate_batch(self, x: np.ndarray, y) -> tuple[float, int, np.ndarray]:
        """(mean loss, number correct, logits) in eval mode."""
        y = self._check_batch(x, y)
        variant = self._variant_for(x.shape, "eval")
        loss, correct, logits = self._evaluate(variant, x, y)
        return (*step_result(loss, correct), logits.astype(np.float32))

    def train_step(self, x: np.ndarray, y, lr: float) -> float:
        """One step: forward, loss, backward, optimizer update, BN running stats. Returns the loss
        (and sets ``last_correct``)."""
        loss, self.last_correct = self.submit_train_step(x, y, lr).result()
        return loss

    @serialised
    def submit_train_step(self, x: np.ndarray, y, lr: float):
        """Start one training step; ``.result()`` gives ``(loss, number correct)``. The CPU path has run
        the step by the time this returns; the CUDA path returns once the step is queued on its stream."""
        if not self.plan.training:
            raise ValueError("this plan was compiled with training=False; compile a train variant to train")
        y = self._check_batch(x, y)
        lr = self._check_lr(lr)
        variant = self._variant_for(x.shape, "train")
        step = self._train(variant, x, y, lr)
        self.step_count += 1
        return step

    def train_steps(self, steps):
        """``(loss, correct)`` of each ``(x, y, lr)`` of ``steps``, in order, with step k+1 submitted
        before step k's result is read (on the CUDA path the host stages the next batch while the
        device runs)."""
        pending = None
        for x, y, lr in steps:
            submitted = self.submit_train_step(x, y, lr)
            if pending is not None:
                loss, self.last_correct = pending.result()
                yield loss, self.last_correct
            pending = submitted
        if pending is not None:
            loss, self.last_correct = pending.result()
            yield loss, self.last_correct

    # ---- batches ---------------------------------------------------------------------------------------
    def _variant_for(self, shape, graph: str) -> str:
        for name, v in self.plan.variants.items():
            if v.graph == graph and v.input_shape == tuple(shape):
                return name
        compiled = {n: v.input_shape for n, v in self.plan.variants.items() if v.graph == graph}
        raise InputError(f"no compiled {graph} variant takes a batch of shape {tuple(shape)}; compiled {graph} "
                         f"variants: {compiled}. Compile a variant for this shape (the task does this for the last "
                         f"partial batch)")

    def _check_batch(self, x, y=None):
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            raise InputError(f"expected the batch as a float32 numpy array (N, H, W, C), got "
                             f"{type(x).__name__} {getattr(x, 'dtype', '')}")
        if x.ndim != 4:
            raise InputError(f"expected an NHWC batch (4-D), got shape {x.shape}")
        if not np.isfinite(x).all():
            raise InputError("the batch contains NaN or Inf values; clean the data (or its normalisation) first")
        if y is not None:
            y = np.asarray(y)
            if y.shape != (x.shape[0],) or not np.issubdtype(y.dtype, np.integer):
                raise InputError(f"expected integer labels of shape ({x.shape[0]},), got {y.dtype} {y.shape}")
            if y.size and (y.min() < 0 or y.max() >= self.classes):
                raise InputError(f"labels must be in [0, {self.classes}), got values in [{y.min()}, {y.max()}]")
        return y

    @staticmethod
    def _check_lr(lr):
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
            raise InputError(f"lr must be a finite number >= 0, got {lr!r}")
        return float(lr)

    # ---- the model's state by name ---------------------------------------------------------------------
    def gradients(self) -> dict[str, np.ndarray]:
        """Parameter gradients of the last train step, by name, in PyTorch layout."""
        return {p.name: to_torch_layout(p, self._read(p.grad)) for p in self.plan.params if p.grad >= 0}

    @serialised
    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters and BN statistics by name, in PyTorch layouts (copies)."""
        return {p.name: to_torch_layout(p, self._read(p.tensor)) for p in self.plan.params}

    def check_state_dict(self, state: dict, strict: bool = True) -> dict[int, np.ndarray]:
        """Validate PyTorch-layout arrays against the plan (names, shapes, real numeric dtypes, finite
        values) and return them converted, by tensor id; raises `StateError` listing every problem."""
        expected = self._param_by_name
        converted, problems = {}, _Problems()
        if strict:
            problems.keys(sorted(set(expected) - set(state)), sorted(set(state) - set(expected)))
        for name, value in state.items():
            if name in expected:
                spec = expected[name]
                array = np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)
                if problems.check_array(name, array, torch_shape(spec), ("f", "i", "u")):
                    converted[spec.tensor] = from_torch_layout(spec, array)
        problems.raise_if_any("load_state_dict", WEIGHTS_FIX)
        return converted

    @serialised
    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Load PyTorch-layout arrays (numpy, or anything `np.asarray` takes: torch tensors too).
        Everything is validated first (`check_state_dict`); on any problem nothing is written."""
        for tid, value in self.check_state_dict(state, strict).items():
            self._write(tid, value)

    @serialised
    def optimizer_state(self) -> dict[str, np.ndarray]:
        """Optimizer state tensors by name (`state0.<param>`, ...) plus the step count."""
        state = {t.name: self._read(t.id) for t in self._state_tensors()}
        state["step"] = np.array(self.step_count, dtype=np.int64)
        return state

    def check_optimizer_state(self, state: dict) -> tuple[dict[int, np.ndarray], int]:
        """Validate an `optimizer_state()` dict: every state tensor present with its exact shape (no
        broadcasting), a floating dtype and finite values; `step` an integer >= 0; `amp.*` (the CUDA
        path's loss-scale counters) finite scalars. Returns (arrays by tensor id, step)."""
        tensors = {t.name: t for t in self._state_tensors()}
        problems = _Problems()
        extra = sorted(k for k in set(state) - set(tensors) - {STEP_KEY} if not k.startswith(AMP_PREFIX))
        problems.keys(sorted(set(tensors) - set(state)) + ([STEP_KEY] if STEP_KEY not in state else []), extra)
        converted = {}
        for name, t in tensors.items():
            if name in state:
                array = np.asarray(state[name])
                if problems.check_array(name, array, tuple(t.shape), ("f",)):
                    converted[t.id] = array.astype(t.dtype)
        step = 0
        if STEP_KEY in state:
            raw = np.asarray(state[STEP_KEY])
            if raw.shape != () or raw.dtype.kind not in "iu" or int(raw) < 0:
                problems.add(f"'step' must be one integer >= 0, got {raw.dtype} {raw.shape} {raw.tolist()!r}")
            else:
                step = int(raw)
        for name in sorted(k for k in state if k.startswith(AMP_PREFIX)):
            raw = np.asarray(state[name])
            if raw.size != 1 or raw.dtype.kind not in "fiu" or not np.isfinite(raw).all() or raw.reshape(-1)[0] < 0:
                problems.add(f"{name!r} must be one finite number >= 0, got {raw.dtype} {raw.shape}")
        problems.raise_if_any("load_optimizer_state", OPTIMIZER_FIX)
        return converted, step

    def _state_tensors(self) -> list:
        """The optimizer-state tensors, slot by slot (`state0.*`, then `state1.*`), as the plan lays them out."""
        trainable = [p for p in self.plan.params if p.state]
        slots = len(trainable[0].state) if trainable else 0
        return [self.plan.tensor(p.state[slot]) for slot in range(slots) for p in trainable]

    @serialised
    def load_optimizer_state(self, state: dict) -> None:
        """Load an `optimizer_state()` dict; everything is validated first, so on any problem nothing is written."""
        converted, step = self.check_optimizer_state(state)
        for tid, value in converted.items():
            self._write(tid, value)
        self.step_count = step
