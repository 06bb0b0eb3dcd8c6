"""What every executor of a CompiledPlan shares: input checks, variant lookup, and the
state of a model by name in PyTorch layouts (parameters, gradients, optimizer state).

An executor (`cpu_ref.CpuExecutor`, `cuda_kernels.CudaExecutor`) subclasses `ExecutorBase`
and provides two accessors over its memory, in the planner's internal layouts:
`_read(tensor_id) -> np.ndarray` (a host copy) and `_write(tensor_id, value)`.
"""
from __future__ import annotations

import math

import numpy as np

from planner.init import from_torch_layout, to_torch_layout, torch_shape


def dropout_seed(seed: int, position: int) -> int:
    """The dropout stream of the primitive at ``position`` in ``plan.primitives``: the same on every
    path and in the fused and unfused plans of one BluePrint (fusion never reorders primitives)."""
    return seed * 1_000_003 + position


class InputError(ValueError):
    """A batch the plan cannot run: wrong shape/dtype, labels out of range, NaN/Inf values."""


class StateDictError(KeyError, ValueError):
    """A state dict that does not fit the plan (missing, unexpected or mis-shaped keys); nothing was
    loaded. A KeyError for mapping code, a ValueError (a user error) for the CLI."""

    def __str__(self) -> str:
        return self.args[0]


class ExecutorBase:
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
        grads = {}
        for t in self.plan.tensors:
            if t.region == "grads":
                spec = self._param_by_name[t.name[len("grad."):]]
                grads[spec.name] = to_torch_layout(spec, self._read(t.id))
        return grads

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters and BN statistics by name, in PyTorch layouts (copies)."""
        return {p.name: to_torch_layout(p, self._read(p.tensor)) for p in self.plan.params}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Load PyTorch-layout arrays (numpy, or anything `np.asarray` takes: torch tensors too)."""
        expected = self._param_by_name
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        converted, wrong = {}, []
        for name, value in state.items():
            if name not in expected:
                continue
            spec = expected[name]
            array = np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)
            if tuple(array.shape) != torch_shape(spec):
                wrong.append(f"{name}: expected {torch_shape(spec)}, got {tuple(array.shape)}")
                continue
            converted[spec.tensor] = from_torch_layout(spec, array)
        problems = []
        if strict and missing:
            problems.append(f"missing keys {missing[:10]}{' ...' if len(missing) > 10 else ''}")
        if strict and unexpected:
            problems.append(f"unexpected keys {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}")
        if wrong:
            problems.append("mis-shaped keys " + "; ".join(wrong[:10]))
        if problems:
            raise StateDictError("load_state_dict: " + "; ".join(problems) + " (nothing was loaded); the weights "
                                 "are for another model or input shape")
        for tid, value in converted.items():
            self._write(tid, value)

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """Optimizer state tensors by name (`state0.<param>`, ...) plus the step count."""
        state = {t.name: self._read(t.id) for t in self.plan.tensors if t.region == "optim"}
        state["step"] = np.array(self.step_count, dtype=np.int64)
        return state

    def load_optimizer_state(self, state: dict) -> None:
        names = {t.name: t for t in self.plan.tensors if t.region == "optim"}
        missing = sorted(set(names) - set(state))
        if missing:
            raise KeyError(f"load_optimizer_state: missing keys {missing[:10]}")
        for name, t in names.items():
            self._write(t.id, np.asarray(state[name], np.float32))
        self.step_count = int(state.get("step", 0))
