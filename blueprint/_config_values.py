"""Argument checks, ``repr`` chains and keyword construction shared by the configuration values
of `blueprint.optim` (losses, optimizers, schedules)."""
from __future__ import annotations

import math
from dataclasses import fields

def _number(setter: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{setter} expects a real number; found {type(value).__name__} {value!r}.")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{setter} expects a finite number; found {value!r}.")
    return value


def _non_negative(setter: str, value) -> float:
    value = _number(setter, value)
    if value < 0:
        raise ValueError(f"{setter} expects a value >= 0; found {value!r}. Pass a non-negative number.")
    return value


def _positive(setter: str, value) -> float:
    value = _number(setter, value)
    if value <= 0:
        raise ValueError(f"{setter} expects a value > 0; found {value!r}. Pass a positive number.")
    return value


def _unit_interval(setter: str, value) -> float:
    """A value in [0, 1)."""
    value = _number(setter, value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{setter} expects a value in [0, 1); found {value!r}.")
    return value


def _count(setter: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{setter} expects an integer number of epochs/steps; found {type(value).__name__} {value!r}.")
    if value < minimum:
        raise ValueError(f"{setter} expects an integer >= {minimum}; found {value}.")
    return value


def _flag(setter: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{setter} expects True or False; found {type(value).__name__} {value!r}.")
    return value


def _chain(constructor: str, calls: list[tuple[str, str]]) -> str:
    return constructor + "".join(f".{name}({args})" for name, args in calls)


#: public methods that do not return a changed value
NOT_SETTERS = frozenset({"validate", "lr_at", "initial_state", "after_epoch", "lr_from"})


def setter_names(cls) -> tuple[str, ...]:
    """The builder methods of a config class, in definition order: its keyword arguments."""
    names = []
    for klass in reversed(cls.__mro__[:-1]):
        for name, member in vars(klass).items():
            if callable(member) and not name.startswith("_") and name not in NOT_SETTERS and name not in names:
                names.append(name)
    return tuple(names)


def keyword_construction(cls, setters: tuple[str, ...] | None = None, hint: str = ""):
    """Let ``cls(setter=value, ...)`` equal ``cls().setter(value)...`` (validated by the setters);
    ``setters`` defaults to every builder method (:func:`setter_names`).

    Field names stay accepted as keywords because ``dataclasses.replace`` builds values with them;
    positional arguments are refused (``SGD(model.parameters(), lr=0.1)`` has nothing to bind to:
    the task owns the parameters)."""
    field_init = cls.__init__
    setters = setters or setter_names(cls)
    field_names = {f.name for f in fields(cls)}

    def __init__(self, *args, **kwargs):
        if args:
            raise TypeError(f"{cls.__name__}() takes keyword arguments only; found {len(args)} positional "
                            f"argument(s). Pass e.g. {cls.__name__}({setters[0]}=...); accepted keywords: "
                            f"{', '.join(setters)}. (The task owns the parameters: do not pass them.)")
        unknown = [k for k in kwargs if k not in setters and k not in field_names]
        if unknown:
            raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {unknown[0]!r}; accepted "
                            f"keywords: {', '.join(setters)}.{hint}")
        field_init(self, **{k: v for k, v in kwargs.items() if k in field_names})
        value = self
        for name, argument in kwargs.items():
            if name in setters:
                value = getattr(value, name)(*(argument if _takes_several(cls, name) else (argument,)))
        if value is not self:
            for f in fields(cls):
                object.__setattr__(self, f.name, getattr(value, f.name))

    __init__.__qualname__ = f"{cls.__name__}.__init__"
    __init__.__doc__ = f"Keywords: {', '.join(setters)} (each the setter of that name)."
    cls.__init__ = __init__
    return cls


def _takes_several(cls, setter: str) -> bool:
    code = getattr(cls, setter).__code__
    return code.co_argcount > 2       # self plus more than one argument: passed as a tuple


def _check_position(schedule: str, epoch: int, step: int, steps_per_epoch: int, total_epochs: int) -> None:
    if steps_per_epoch < 1 or total_epochs < 1:
        raise ValueError(
            f"{schedule}.lr_at expects steps_per_epoch >= 1 and total_epochs >= 1; "
            f"found {steps_per_epoch} and {total_epochs}."
        )
    if epoch < 0 or not 0 <= step < steps_per_epoch:
        raise ValueError(
            f"{schedule}.lr_at expects epoch >= 0 and 0 <= step < steps_per_epoch ({steps_per_epoch}); "
            f"found epoch {epoch}, step {step}."
        )


#: EpochRecord fields a callback or ReduceLROnPlateau may watch, and the direction that is better.
MONITOR_MODES = {"val_loss": "min", "val_accuracy": "max", "val_top5": "max", "train_loss": "min",
                 "train_accuracy": "max"}
MODES = ("auto", "min", "max")


def _monitor(owner: str, name) -> str:
    if name not in MONITOR_MODES:
        raise ValueError(f"{owner} monitor expects one of {', '.join(MONITOR_MODES)}; found {name!r}.")
    return name


def _mode(owner: str, mode) -> str:
    if mode not in MODES:
        raise ValueError(f"{owner} mode expects 'auto' (from the monitor's name), 'min' or 'max'; found {mode!r}.")
    return mode


def resolved_mode(monitor: str, mode: str) -> str:
    """'min' or 'max': ``mode`` itself, or for 'auto' the direction in which ``monitor`` improves."""
    return MONITOR_MODES[monitor] if mode == "auto" else mode
