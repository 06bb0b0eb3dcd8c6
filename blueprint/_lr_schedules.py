"""The two schedules that are not a plain function of epoch and step count:

- `OneCycleLR`: torch's one-cycle policy (warm up from ``max_lr / div_factor`` to ``max_lr``, then
  anneal to ``max_lr / div_factor / final_div_factor``), stepped after every batch; only the learning
  rate cycles (torch's ``cycle_momentum=False``: the optimizer's momentum stays as configured).
- `ReduceLROnPlateau`: torch's rule, driven by a metric of the epoch record; its state (the current
  lr, the best value, the bad-epoch and cooldown counters) travels in the task's checkpoints.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from blueprint._config_values import (_chain, _check_position, _count, _flag, _monitor, _mode, _non_negative,
                                      _positive, _unit_interval, keyword_construction, resolved_mode)

ANNEAL_STRATEGIES = ("cos", "linear")
THRESHOLD_MODES = ("rel", "abs")
PLATEAU_EPS = 1e-8   # torch: a reduction smaller than this is ignored


def _anneal(strategy: str, start: float, end: float, fraction: float) -> float:
    if strategy == "cos":
        return end + (start - end) / 2.0 * (math.cos(math.pi * fraction) + 1)
    return (end - start) * fraction + start


@keyword_construction
@dataclass(frozen=True)
class OneCycleLR:
    """The one-cycle policy exactly as ``torch.optim.lr_scheduler.OneCycleLR`` with
    ``total_steps = epochs * steps_per_epoch`` and ``cycle_momentum=False``, stepped every batch.

    Fields (setter): ``base_learning_rate`` (``max_lr``; None: the optimizer's lr is the peak),
    ``warmup_fraction`` (``pct_start``, default 0.3), ``strategy`` (``anneal_strategy``, 'cos' or
    'linear'), ``initial_div`` (``div_factor``, 25), ``final_div`` (``final_div_factor``, 1e4),
    ``three_phases`` (``three_phase``, False).

    >>> s = OneCycleLR().max_lr(1.0)
    >>> [round(s.lr_at(0, step, 10, 0.1, 1), 4) for step in (0, 2, 9)]
    [0.04, 1.0, 0.0]
    """

    base_learning_rate: float | None = None
    warmup_fraction: float = 0.3
    strategy: str = "cos"
    initial_div: float = 25.0
    final_div: float = 1e4
    three_phases: bool = False

    def max_lr(self, x: float | None) -> OneCycleLR:
        """The peak learning rate (None: the optimizer's lr)."""
        return replace(self, base_learning_rate=None if x is None else _non_negative("OneCycleLR.max_lr", x))

    def pct_start(self, fraction: float) -> OneCycleLR:
        """The fraction of all steps spent rising to the peak (default 0.3)."""
        return replace(self, warmup_fraction=_unit_interval("OneCycleLR.pct_start", fraction))

    def anneal_strategy(self, name: str) -> OneCycleLR:
        """'cos' (default) or 'linear'."""
        if name not in ANNEAL_STRATEGIES:
            raise ValueError(f"OneCycleLR.anneal_strategy expects 'cos' or 'linear'; found {name!r}.")
        return replace(self, strategy=name)

    def div_factor(self, d: float) -> OneCycleLR:
        """The first lr is ``max_lr / div_factor`` (default 25)."""
        return replace(self, initial_div=_positive("OneCycleLR.div_factor", d))

    def final_div_factor(self, d: float) -> OneCycleLR:
        """The last lr is ``max_lr / div_factor / final_div_factor`` (default 1e4)."""
        return replace(self, final_div=_positive("OneCycleLR.final_div_factor", d))

    def three_phase(self, enabled: bool = True) -> OneCycleLR:
        """torch's three-phase variant: up, back down to the first lr, then to the last."""
        return replace(self, three_phases=_flag("OneCycleLR.three_phase", enabled))

    def validate(self) -> OneCycleLR:
        return self

    def lr_at(self, epoch: int, step: int, steps_per_epoch: int, base_lr: float, total_epochs: int) -> float:
        _check_position("OneCycleLR", epoch, step, steps_per_epoch, total_epochs)
        peak = base_lr if self.base_learning_rate is None else self.base_learning_rate
        total = total_epochs * steps_per_epoch
        number = epoch * steps_per_epoch + step
        if number >= total:
            raise ValueError(f"OneCycleLR.lr_at: step {number} is past the cycle's {total} steps "
                             f"({total_epochs} epochs x {steps_per_epoch}); the cycle spans the configured epochs.")
        first = peak / self.initial_div
        last = first / self.final_div
        rise = float(self.warmup_fraction * total) - 1
        phases = ([(rise, first, peak), (2 * float(self.warmup_fraction * total) - 2, peak, first),
                   (total - 1, first, last)] if self.three_phases else [(rise, first, peak), (total - 1, peak, last)])
        start_step = 0.0
        for index, (end_step, start_lr, end_lr) in enumerate(phases):
            if number <= end_step or index == len(phases) - 1:
                if end_step == start_step:
                    raise ValueError(f"OneCycleLR: a phase of {total} steps with pct_start {self.warmup_fraction} "
                                     "has no steps; train for more steps or change pct_start.")
                return _anneal(self.strategy, start_lr, end_lr, (number - start_step) / (end_step - start_step))
            start_step = end_step
        raise AssertionError("unreachable: the last phase always returns")

    def __repr__(self) -> str:
        calls = [("max_lr", repr(self.base_learning_rate))] if self.base_learning_rate is not None else []
        default = OneCycleLR()
        for setter, name in (("pct_start", "warmup_fraction"), ("anneal_strategy", "strategy"),
                             ("div_factor", "initial_div"), ("final_div_factor", "final_div"),
                             ("three_phase", "three_phases")):
            if getattr(self, name) != getattr(default, name):
                calls.append((setter, repr(getattr(self, name))))
        return _chain("OneCycleLR()", calls)


@keyword_construction
@dataclass(frozen=True)
class ReduceLROnPlateau:
    """Cut the learning rate by ``factor`` when ``monitor`` has not improved for ``patience`` epochs,
    exactly as ``torch.optim.lr_scheduler.ReduceLROnPlateau`` stepped with that metric after every
    epoch. The lr is constant within an epoch.

    Fields (setter): ``monitor_name`` (``monitor``: an EpochRecord field, default 'val_loss'),
    ``mode_name`` (``mode``: 'auto' from the monitor, 'min' or 'max'), ``reduction`` (``factor``,
    0.1), ``patience_epochs`` (``patience``, 10), ``threshold_value`` (``threshold``, 1e-4),
    ``relative`` (``threshold_mode``: 'rel' or 'abs'), ``cooldown_epochs`` (``cooldown``, 0),
    ``min_learning_rate`` (``min_lr``, 0), ``base_learning_rate`` (``base_lr``; None: the optimizer's lr).

    >>> s = ReduceLROnPlateau(patience=1, factor=0.5)
    >>> state = s.initial_state(0.1)
    >>> for loss in (1.0, 1.0, 1.0):
    ...     state = s.after_epoch(state, {"val_loss": loss})
    >>> s.lr_at(3, 0, 10, 0.1, 5, state)
    0.05
    """

    monitor_name: str = "val_loss"
    mode_name: str = "auto"
    reduction: float = 0.1
    patience_epochs: int = 10
    threshold_value: float = 1e-4
    relative: bool = True
    cooldown_epochs: int = 0
    min_learning_rate: float = 0.0
    base_learning_rate: float | None = None

    def monitor(self, name: str) -> ReduceLROnPlateau:
        """The EpochRecord field to watch: val_loss (default), val_accuracy, val_top5, train_loss, train_accuracy."""
        return replace(self, monitor_name=_monitor("ReduceLROnPlateau", name))

    def mode(self, name: str) -> ReduceLROnPlateau:
        """'min', 'max', or 'auto' (default: min for a loss, max for an accuracy)."""
        return replace(self, mode_name=_mode("ReduceLROnPlateau", name))

    def factor(self, f: float) -> ReduceLROnPlateau:
        """The lr is multiplied by this at each plateau (0 < f < 1, default 0.1)."""
        f = _positive("ReduceLROnPlateau.factor", f)
        if f >= 1:
            raise ValueError(f"ReduceLROnPlateau.factor expects a value < 1; found {f!r}.")
        return replace(self, reduction=f)

    def patience(self, epochs: int) -> ReduceLROnPlateau:
        """Epochs without improvement tolerated before a cut (default 10)."""
        return replace(self, patience_epochs=_count("ReduceLROnPlateau.patience", epochs, 0))

    def threshold(self, t: float) -> ReduceLROnPlateau:
        """The least change that counts as an improvement (default 1e-4, relative)."""
        return replace(self, threshold_value=_non_negative("ReduceLROnPlateau.threshold", t))

    def threshold_mode(self, name: str) -> ReduceLROnPlateau:
        """'rel' (default: best * (1 -/+ threshold)) or 'abs' (best -/+ threshold)."""
        if name not in THRESHOLD_MODES:
            raise ValueError(f"ReduceLROnPlateau.threshold_mode expects 'rel' or 'abs'; found {name!r}.")
        return replace(self, relative=name == "rel")

    def cooldown(self, epochs: int) -> ReduceLROnPlateau:
        """Epochs after a cut during which bad epochs are not counted (default 0)."""
        return replace(self, cooldown_epochs=_count("ReduceLROnPlateau.cooldown", epochs, 0))

    def min_lr(self, x: float) -> ReduceLROnPlateau:
        """The lr never goes below this (default 0)."""
        return replace(self, min_learning_rate=_non_negative("ReduceLROnPlateau.min_lr", x))

    def base_lr(self, x: float | None) -> ReduceLROnPlateau:
        """The lr before any cut (None: the optimizer's lr)."""
        return replace(self, base_learning_rate=None if x is None else _non_negative("ReduceLROnPlateau.base_lr", x))

    def validate(self) -> ReduceLROnPlateau:
        return self

    def initial_state(self, base_lr: float) -> dict:
        """The state before the first epoch: torch's ``best`` starts at +-inf."""
        worst = math.inf if resolved_mode(self.monitor_name, self.mode_name) == "min" else -math.inf
        return {"lr": float(base_lr), "best": worst, "bad_epochs": 0, "cooldown_left": 0}

    def after_epoch(self, state: dict, record) -> dict:
        """torch's ``scheduler.step(metric)`` with the epoch's ``record[monitor]``."""
        current = float(record[self.monitor_name])
        lr, best, bad, cooldown = state["lr"], state["best"], state["bad_epochs"], state["cooldown_left"]
        if self._better(current, best):
            best, bad = current, 0
        else:
            bad += 1
        if cooldown > 0:
            cooldown, bad = cooldown - 1, 0
        if bad > self.patience_epochs:
            reduced = max(lr * self.reduction, self.min_learning_rate)
            if lr - reduced > PLATEAU_EPS:
                lr = reduced
            cooldown, bad = self.cooldown_epochs, 0
        return {"lr": lr, "best": best, "bad_epochs": bad, "cooldown_left": cooldown}

    def _better(self, current: float, best: float) -> bool:
        low = resolved_mode(self.monitor_name, self.mode_name) == "min"
        if self.relative:
            return current < best * (1 - self.threshold_value) if low else current > best * (1 + self.threshold_value)
        return current < best - self.threshold_value if low else current > best + self.threshold_value

    def lr_at(self, epoch: int, step: int, steps_per_epoch: int, base_lr: float, total_epochs: int,
              state: dict | None = None) -> float:
        """The lr of ``state`` (None: the lr before any cut)."""
        _check_position("ReduceLROnPlateau", epoch, step, steps_per_epoch, total_epochs)
        if state is not None:
            return state["lr"]
        return base_lr if self.base_learning_rate is None else self.base_learning_rate

    def __repr__(self) -> str:
        default, calls = ReduceLROnPlateau(), []
        for setter, name in (("monitor", "monitor_name"), ("mode", "mode_name"), ("factor", "reduction"),
                             ("patience", "patience_epochs"), ("threshold", "threshold_value"),
                             ("cooldown", "cooldown_epochs"), ("min_lr", "min_learning_rate"),
                             ("base_lr", "base_learning_rate")):
            if getattr(self, name) != getattr(default, name):
                calls.append((setter, repr(getattr(self, name))))
        if not self.relative:
            calls.append(("threshold_mode", "'abs'"))
        return _chain("ReduceLROnPlateau()", calls)
