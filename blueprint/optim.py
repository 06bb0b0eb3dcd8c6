"""Loss, optimizer and learning-rate schedule configurations: immutable values, no math.

Every config is a frozen dataclass. Setters are named like ``torch.optim``'s arguments
(``SGD().lr(0.05).momentum(0.9)``) and return a new value; the stored numbers are read from
fields with descriptive names (``SGD().lr(0.05).learning_rate == 0.05``) because a slotted
dataclass cannot have a field and a method of the same name. The update rules themselves
are the optimizer kernels in ``cpu_ref`` / ``cuda_kernels`` (see docs/kernel-contract.md).

``repr()`` of every value is constructor-chain code that evaluates back to an equal value,
so a checkpoint can store it as text. Every config also takes its setters' names as keywords,
PyTorch-style: ``SGD(lr=0.1, momentum=0.9) == SGD().lr(0.1).momentum(0.9)`` (the same value, the
same ``repr``; a setter with several arguments takes a tuple: ``Adam(betas=(0.9, 0.99))``).

**One learning rate.** The optimizer's ``lr`` is the learning rate the schedule shapes. A schedule
may set its own ``base_lr`` (``max_lr`` for `OneCycleLR`); then that value is the one used and the
optimizer's ``lr`` is ignored, and `DeepLearningTask` warns when the optimizer's ``lr`` was set to
another value. Set the learning rate in one place.

>>> from blueprint.optim import *
>>> opt = SGD().lr(0.1).momentum(0.9).nesterov(True)
>>> opt
SGD().lr(0.1).momentum(0.9).nesterov(True)
>>> eval(repr(opt)) == opt
True
"""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, replace
from typing import ClassVar

from blueprint._config_values import (_chain, _check_position, _count, _flag, _non_negative, _positive,
                                      _unit_interval, keyword_construction, setter_names)
from blueprint._lr_schedules import OneCycleLR, ReduceLROnPlateau

__all__ = [
    "CrossEntropyLoss",
    "SGD",
    "Adam",
    "AdamW",
    "ConstantLR",
    "StepLR",
    "MultiStepLR",
    "CosineAnnealingLR",
    "OneCycleLR",
    "ReduceLROnPlateau",
]



# ---------------------------------------------------------------- loss

@keyword_construction
@dataclass(frozen=True)
class CrossEntropyLoss:
    """Softmax cross-entropy with mean reduction and PyTorch's label smoothing.

    Field: ``smoothing`` (set by ``.label_smoothing(x)``, 0 <= x < 1).

    >>> CrossEntropyLoss().label_smoothing(0.1)
    CrossEntropyLoss().label_smoothing(0.1)
    >>> CrossEntropyLoss().label_smoothing(0.1).smoothing
    0.1
    """

    smoothing: float = 0.0

    def label_smoothing(self, x: float) -> CrossEntropyLoss:
        """Mix the one-hot target with the uniform distribution by ``x`` (0 <= x < 1; torch's rule)."""
        return replace(self, smoothing=_unit_interval("CrossEntropyLoss.label_smoothing", x))

    def __repr__(self) -> str:
        calls = [("label_smoothing", repr(self.smoothing))] if self.smoothing else []
        return _chain("CrossEntropyLoss()", calls)


# ---------------------------------------------------------------- optimizers

@keyword_construction
@dataclass(frozen=True)
class SGD:
    """Stochastic gradient descent exactly as ``torch.optim.SGD`` (coupled weight decay).

    Fields (setter): ``learning_rate`` (``lr``, default 0.1), ``momentum_factor``
    (``momentum``), ``dampening_factor`` (``dampening``), ``use_nesterov`` (``nesterov``),
    ``weight_decay_factor`` (``weight_decay``). ``state_slots`` is the number of
    parameter-sized state tensors (the momentum buffer). Nesterov needs momentum > 0 and
    dampening 0; ``validate()`` (called by the task) checks it, so setters may come in any order.

    >>> opt = SGD().lr(0.05).momentum(0.9).weight_decay(5e-4)
    >>> opt.state_slots, opt.momentum_factor
    (1, 0.9)
    >>> SGD().nesterov(True).validate()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: SGD.nesterov(True) needs momentum > 0 and dampening == 0; found momentum 0.0, ...
    """

    learning_rate: float = 0.1
    momentum_factor: float = 0.0
    dampening_factor: float = 0.0
    use_nesterov: bool = False
    weight_decay_factor: float = 0.0

    def lr(self, x: float) -> SGD:
        """The learning rate (default 0.1); a schedule's own ``base_lr`` replaces it."""
        return replace(self, learning_rate=_non_negative("SGD.lr", x))

    def momentum(self, m: float) -> SGD:
        """The momentum factor (default 0: none)."""
        return replace(self, momentum_factor=_non_negative("SGD.momentum", m))

    def dampening(self, d: float) -> SGD:
        """Dampening of the momentum (default 0)."""
        return replace(self, dampening_factor=_non_negative("SGD.dampening", d))

    def nesterov(self, enabled: bool = True) -> SGD:
        """Nesterov momentum (needs momentum > 0 and dampening 0)."""
        return replace(self, use_nesterov=_flag("SGD.nesterov", enabled))

    def weight_decay(self, w: float) -> SGD:
        """L2 penalty added to the gradient (coupled, as torch's SGD; default 0)."""
        return replace(self, weight_decay_factor=_non_negative("SGD.weight_decay", w))

    @property
    def state_slots(self) -> int:
        return 1 if self.momentum_factor > 0 else 0

    def validate(self) -> SGD:
        """Check rules that involve several fields; return ``self``."""
        if self.use_nesterov and (self.momentum_factor <= 0 or self.dampening_factor != 0):
            raise ValueError(
                "SGD.nesterov(True) needs momentum > 0 and dampening == 0; found "
                f"momentum {self.momentum_factor!r}, dampening {self.dampening_factor!r}. "
                "Add .momentum(0.9) (and .dampening(0)) or drop .nesterov(True)."
            )
        return self

    def __repr__(self) -> str:
        calls = [("lr", repr(self.learning_rate))]
        if self.momentum_factor:
            calls.append(("momentum", repr(self.momentum_factor)))
        if self.dampening_factor:
            calls.append(("dampening", repr(self.dampening_factor)))
        if self.use_nesterov:
            calls.append(("nesterov", "True"))
        if self.weight_decay_factor:
            calls.append(("weight_decay", repr(self.weight_decay_factor)))
        return _chain("SGD()", calls)


class _AdamSetters:
    """Setters shared by Adam and AdamW (the two differ in defaults and in ``decoupled``)."""

    state_slots: ClassVar[int] = 2  # first and second moment

    def lr(self, x: float):
        """The learning rate (default 1e-3); a schedule's own ``base_lr`` replaces it."""
        return replace(self, learning_rate=_non_negative(f"{type(self).__name__}.lr", x))

    def betas(self, b1: float, b2: float):
        """The decay rates of the first and second moment (default 0.9, 0.999)."""
        where = f"{type(self).__name__}.betas"
        return replace(self, beta1=_unit_interval(where, b1), beta2=_unit_interval(where, b2))

    def eps(self, e: float):
        """Added to the denominator (default 1e-8)."""
        return replace(self, epsilon=_positive(f"{type(self).__name__}.eps", e))

    def weight_decay(self, w: float):
        """Weight decay: added to the gradient (Adam) or decoupled (AdamW)."""
        return replace(self, weight_decay_factor=_non_negative(f"{type(self).__name__}.weight_decay", w))

    def validate(self):
        """Nothing spans several fields; present so the task can validate every optimizer."""
        return self

    def __repr__(self) -> str:
        default = type(self)()
        calls = [("lr", repr(self.learning_rate))]
        if (self.beta1, self.beta2) != (default.beta1, default.beta2):
            calls.append(("betas", f"{self.beta1!r}, {self.beta2!r}"))
        if self.epsilon != default.epsilon:
            calls.append(("eps", repr(self.epsilon)))
        if self.weight_decay_factor != default.weight_decay_factor:
            calls.append(("weight_decay", repr(self.weight_decay_factor)))
        return _chain(f"{type(self).__name__}()", calls)


@keyword_construction
@dataclass(frozen=True, repr=False)
class Adam(_AdamSetters):
    """Adam exactly as ``torch.optim.Adam`` (weight decay added to the gradient).

    Fields (setter): ``learning_rate`` (``lr``, default 1e-3), ``beta1, beta2``
    (``betas``, default 0.9, 0.999, each in [0, 1)), ``epsilon`` (``eps``, default 1e-8),
    ``weight_decay_factor`` (``weight_decay``, default 0). ``state_slots == 2``.

    >>> Adam().lr(3e-4).betas(0.9, 0.99)
    Adam().lr(0.0003).betas(0.9, 0.99)
    """

    learning_rate: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_decay_factor: float = 0.0
    decoupled: ClassVar[bool] = False


@keyword_construction
@dataclass(frozen=True, repr=False)
class AdamW(_AdamSetters):
    """AdamW exactly as ``torch.optim.AdamW`` (decoupled weight decay, default 1e-2).

    Same fields and setters as :class:`Adam`.

    >>> AdamW().weight_decay(0.05)
    AdamW().lr(0.001).weight_decay(0.05)
    >>> AdamW().weight_decay_factor
    0.01
    """

    learning_rate: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_decay_factor: float = 1e-2
    decoupled: ClassVar[bool] = True


# ---------------------------------------------------------------- schedules

def _base_or(own: float | None, optimizer_lr: float) -> float:
    return optimizer_lr if own is None else own


def _common_calls(schedule, default_per_batch: bool) -> list[tuple[str, str]]:
    calls = []
    if schedule.base_learning_rate is not None:
        calls.append(("base_lr", repr(schedule.base_learning_rate)))
    if schedule.batchwise != default_per_batch:
        calls.append(("per_batch", repr(schedule.batchwise)))
    return calls


@keyword_construction
@dataclass(frozen=True)
class ConstantLR:
    """The base learning rate at every step (not torch's ``ConstantLR``, which scales a prefix).

    Field: ``base_learning_rate`` (``base_lr``; None → the optimizer's lr).

    >>> ConstantLR().lr_at(epoch=3, step=0, steps_per_epoch=10, base_lr=0.1, total_epochs=5)
    0.1
    >>> ConstantLR().base_lr(0.5).lr_at(0, 0, 10, 0.1, 5)
    0.5
    """

    base_learning_rate: float | None = None

    def base_lr(self, x: float | None) -> ConstantLR:
        """The learning rate (None: the optimizer's lr; when set it replaces that lr)."""
        return replace(self, base_learning_rate=None if x is None else _non_negative("ConstantLR.base_lr", x))

    def validate(self) -> ConstantLR:
        return self

    def lr_at(self, epoch: int, step: int, steps_per_epoch: int, base_lr: float, total_epochs: int) -> float:
        _check_position("ConstantLR", epoch, step, steps_per_epoch, total_epochs)
        return _base_or(self.base_learning_rate, base_lr)

    def __repr__(self) -> str:
        calls = [("base_lr", repr(self.base_learning_rate))] if self.base_learning_rate is not None else []
        return _chain("ConstantLR()", calls)


@keyword_construction
@dataclass(frozen=True)
class StepLR:
    """``base * gamma ** (position // step_size)``, as ``torch.optim.lr_scheduler.StepLR``.

    Fields (setter): ``period`` (``step_size``, required), ``factor`` (``gamma``, default
    0.1), ``base_learning_rate`` (``base_lr``), ``batchwise`` (``per_batch``, default False).
    The position is the epoch; with ``per_batch(True)`` it is the global batch index
    ``epoch * steps_per_epoch + step`` and ``step_size`` counts batches (torch's result when
    ``scheduler.step()`` is called after every batch).

    >>> s = StepLR().step_size(30).gamma(0.1)
    >>> [s.lr_at(e, 0, 100, 0.1, 90) for e in (0, 29, 30, 60)]
    [0.1, 0.1, 0.010000000000000002, 0.0010000000000000002]
    """

    period: int | None = None
    factor: float = 0.1
    base_learning_rate: float | None = None
    batchwise: bool = False

    def step_size(self, k: int) -> StepLR:
        """Epochs (or batches, per_batch) between two cuts by gamma."""
        return replace(self, period=_count("StepLR.step_size", k, 1))

    def gamma(self, g: float) -> StepLR:
        """The factor of each cut (default 0.1)."""
        return replace(self, factor=_positive("StepLR.gamma", g))

    def base_lr(self, x: float | None) -> StepLR:
        """The starting lr (None: the optimizer's lr; when set it replaces that lr)."""
        return replace(self, base_learning_rate=None if x is None else _non_negative("StepLR.base_lr", x))

    def per_batch(self, enabled: bool = True) -> StepLR:
        """Count batches instead of epochs."""
        return replace(self, batchwise=_flag("StepLR.per_batch", enabled))

    def validate(self) -> StepLR:
        if self.period is None:
            raise ValueError("StepLR has no step size; found StepLR() without .step_size(k). Add e.g. .step_size(30).")
        return self

    def lr_at(self, epoch: int, step: int, steps_per_epoch: int, base_lr: float, total_epochs: int) -> float:
        _check_position("StepLR", epoch, step, steps_per_epoch, total_epochs)
        self.validate()
        position = epoch * steps_per_epoch + step if self.batchwise else epoch
        return _base_or(self.base_learning_rate, base_lr) * self.factor ** (position // self.period)

    def __repr__(self) -> str:
        calls = [("step_size", repr(self.period))] if self.period is not None else []
        if self.factor != 0.1:
            calls.append(("gamma", repr(self.factor)))
        return _chain("StepLR()", calls + _common_calls(self, False))


@keyword_construction
@dataclass(frozen=True)
class MultiStepLR:
    """``base * gamma ** (number of milestones <= position)``, as torch's ``MultiStepLR``.

    Fields (setter): ``milestone_positions`` (``milestones``, required: distinct integers
    >= 0, stored sorted), ``factor`` (``gamma``, default 0.1), ``base_learning_rate``
    (``base_lr``), ``batchwise`` (``per_batch``, default False; then milestones count
    global batches, as for :class:`StepLR`).

    >>> s = MultiStepLR().milestones([2, 4])
    >>> [round(s.lr_at(e, 0, 10, 1.0, 6), 6) for e in range(6)]
    [1.0, 1.0, 0.1, 0.1, 0.01, 0.01]
    """

    milestone_positions: tuple[int, ...] = ()
    factor: float = 0.1
    base_learning_rate: float | None = None
    batchwise: bool = False

    def milestones(self, positions) -> MultiStepLR:
        """The epochs (or batches, per_batch) at which the lr is cut by gamma."""
        positions = tuple(_count("MultiStepLR.milestones", p, 0) for p in positions)
        if len(set(positions)) != len(positions):
            raise ValueError(f"MultiStepLR.milestones expects distinct positions; found {list(positions)}.")
        return replace(self, milestone_positions=tuple(sorted(positions)))

    def gamma(self, g: float) -> MultiStepLR:
        """The factor of each cut (default 0.1)."""
        return replace(self, factor=_positive("MultiStepLR.gamma", g))

    def base_lr(self, x: float | None) -> MultiStepLR:
        """The starting lr (None: the optimizer's lr; when set it replaces that lr)."""
        return replace(self, base_learning_rate=None if x is None else _non_negative("MultiStepLR.base_lr", x))

    def per_batch(self, enabled: bool = True) -> MultiStepLR:
        """Count batches instead of epochs."""
        return replace(self, batchwise=_flag("MultiStepLR.per_batch", enabled))

    def validate(self) -> MultiStepLR:
        if not self.milestone_positions:
            raise ValueError("MultiStepLR has no milestones; found MultiStepLR() without .milestones(...). "
                             "Add e.g. .milestones([30, 60]).")
        return self

    def lr_at(self, epoch: int, step: int, steps_per_epoch: int, base_lr: float, total_epochs: int) -> float:
        _check_position("MultiStepLR", epoch, step, steps_per_epoch, total_epochs)
        self.validate()
        position = epoch * steps_per_epoch + step if self.batchwise else epoch
        passed = bisect_right(self.milestone_positions, position)
        return _base_or(self.base_learning_rate, base_lr) * self.factor ** passed

    def __repr__(self) -> str:
        calls = [("milestones", repr(list(self.milestone_positions)))] if self.milestone_positions else []
        if self.factor != 0.1:
            calls.append(("gamma", repr(self.factor)))
        return _chain("MultiStepLR()", calls + _common_calls(self, False))


@keyword_construction
@dataclass(frozen=True)
class CosineAnnealingLR:
    """Linear warmup, then cosine annealing from ``base`` to ``eta_min``.

    Fields (setter): ``warmup_epochs`` (``warmup``, default 0), ``min_lr`` (``eta_min``,
    default 0), ``period_epochs`` (``t_max``; None → ``total_epochs - warmup``),
    ``base_learning_rate`` (``base_lr``), ``batchwise`` (``per_batch``, default True).

    Let ``u`` be the position in units: the global batch ``epoch * steps_per_epoch + step``
    when per batch (``U = steps_per_epoch`` units per epoch), else the epoch (``U = 1``).
    With ``W = warmup * U`` warmup units:

    - ``u < W``: ``lr = base * (u + 1) / W`` (from ``base / W`` up to ``base``);
    - otherwise ``t = (u - W) / U`` epochs after warmup (fractional when per batch),
      ``T = t_max or (total_epochs - warmup)`` and
      ``lr = eta_min + (base - eta_min) * (1 + cos(pi * t / T)) / 2``.

    Without warmup this is torch's closed form of ``CosineAnnealingLR`` (``T_max = T`` epochs,
    or ``T * steps_per_epoch`` when stepped per batch); past ``T`` it continues along the
    cosine, as torch does.

    >>> s = CosineAnnealingLR().per_batch(False)
    >>> [round(s.lr_at(e, 0, 10, 1.0, 4), 6) for e in range(4)]
    [1.0, 0.853553, 0.5, 0.146447]
    >>> w = CosineAnnealingLR().warmup(2).per_batch(False)
    >>> [round(w.lr_at(e, 0, 10, 1.0, 4), 6) for e in range(4)]
    [0.5, 1.0, 1.0, 0.5]
    """

    warmup_epochs: int = 0
    min_lr: float = 0.0
    period_epochs: int | None = None
    base_learning_rate: float | None = None
    batchwise: bool = True

    def warmup(self, epochs: int) -> CosineAnnealingLR:
        """Epochs of linear warmup before the cosine (default 0)."""
        return replace(self, warmup_epochs=_count("CosineAnnealingLR.warmup", epochs, 0))

    def eta_min(self, y: float) -> CosineAnnealingLR:
        """The lr at the end of the cosine (default 0)."""
        return replace(self, min_lr=_non_negative("CosineAnnealingLR.eta_min", y))

    def t_max(self, epochs: int | None) -> CosineAnnealingLR:
        """Epochs of the cosine after warmup (None: the rest of the run)."""
        return replace(self, period_epochs=None if epochs is None else _count("CosineAnnealingLR.t_max", epochs, 1))

    def base_lr(self, x: float | None) -> CosineAnnealingLR:
        """The peak lr (None: the optimizer's lr; when set it replaces that lr)."""
        return replace(self, base_learning_rate=None if x is None else _non_negative("CosineAnnealingLR.base_lr", x))

    def per_batch(self, enabled: bool = True) -> CosineAnnealingLR:
        """Anneal every batch (default) or once per epoch."""
        return replace(self, batchwise=_flag("CosineAnnealingLR.per_batch", enabled))

    def validate(self) -> CosineAnnealingLR:
        return self

    def lr_at(self, epoch: int, step: int, steps_per_epoch: int, base_lr: float, total_epochs: int) -> float:
        _check_position("CosineAnnealingLR", epoch, step, steps_per_epoch, total_epochs)
        base = _base_or(self.base_learning_rate, base_lr)
        units_per_epoch = steps_per_epoch if self.batchwise else 1
        position = epoch * units_per_epoch + (step if self.batchwise else 0)
        warmup_units = self.warmup_epochs * units_per_epoch
        if position < warmup_units:
            return base * (position + 1) / warmup_units
        period = self.period_epochs if self.period_epochs is not None else total_epochs - self.warmup_epochs
        if period < 1:
            raise ValueError(
                f"CosineAnnealingLR has no epochs left to anneal: total_epochs {total_epochs} - warmup "
                f"{self.warmup_epochs} = {period}. Train for more epochs, shorten .warmup(), or set .t_max(epochs)."
            )
        t = (position - warmup_units) / units_per_epoch
        return self.min_lr + (base - self.min_lr) * (1 + math.cos(math.pi * t / period)) / 2

    def __repr__(self) -> str:
        calls = []
        if self.warmup_epochs:
            calls.append(("warmup", repr(self.warmup_epochs)))
        if self.min_lr:
            calls.append(("eta_min", repr(self.min_lr)))
        if self.period_epochs is not None:
            calls.append(("t_max", repr(self.period_epochs)))
        return _chain("CosineAnnealingLR()", calls + _common_calls(self, True))


#: Every learning-rate schedule `DeepLearningTask.scheduler` takes (and a checkpoint may name).
SCHEDULES = (ConstantLR, StepLR, MultiStepLR, CosineAnnealingLR, OneCycleLR, ReduceLROnPlateau)
