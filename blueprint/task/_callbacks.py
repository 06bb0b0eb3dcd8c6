"""Callbacks that act on training, and the state that lets them survive an interrupt.

- `EarlyStopping` ends `fit()` when a metric stops improving (and can put the best weights back);
- `ModelCheckpoint` keeps the N best checkpoints by a metric in the run folder;
- any callback may raise `StopTraining` (or `StopIteration`) to end `fit()` cleanly after the epoch.

Their state, and a stateful scheduler's (`ReduceLROnPlateau`), is *tracked*: held by the task's
session under a key (``scheduler``, ``callback0``, ...) with the ``repr`` of the value it belongs to,
written into every checkpoint (``tracked`` and ``stopped`` in the JSON state; kept weights as
``kept.<key>.<name>`` tensors) and read back by ``resume``, so that an interrupted run stops, keeps
and cuts its learning rate exactly where the uninterrupted one does. A tracked value whose ``repr``
is not in the checkpoint starts afresh.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from blueprint._config_values import _monitor, _mode, resolved_mode
from blueprint._errors import ConfigError
from blueprint._lr_schedules import ReduceLROnPlateau

KEPT_PREFIX = "kept."
BEST_NAME = "best-epoch{epoch:03d}.safetensors"


class StopTraining(Exception):
    """Raise from a callback to end `fit()` after the current epoch, as if the epochs had run out;
    the message is printed and remembered (``task.stopped``)."""


@dataclass(frozen=True)
class Outcome:
    """What a tracked callback decided after an epoch."""

    state: dict
    keep: dict | None = None        # tensors to keep from now on (None: keep what is kept)
    stop: str | None = None         # why training ends here
    restore: bool = False           # load the kept weights into the model
    write: str | None = None        # a checkpoint to write now, as a file name in the folder
    remove: tuple = ()              # file names to delete


def _better(mode: str, value: float, best: float, delta: float) -> bool:
    return value < best - delta if mode == "min" else value > best + delta


@dataclass(frozen=True)
class EarlyStopping:
    """Stop when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` epochs in a
    row (Keras' rule); ``restore_best`` then loads the weights of the best epoch (kept in memory and
    in the checkpoints, so a resumed run restores them too).

    >>> from blueprint.task import DeepLearningTask
    >>> task = DeepLearningTask().callback(EarlyStopping("val_loss", patience=3))   # doctest: +SKIP
    """

    monitor: str = "val_loss"
    patience: int = 5
    min_delta: float = 0.0
    mode: str = "auto"
    restore_best: bool = False

    def __post_init__(self):
        _monitor("EarlyStopping", self.monitor)
        _mode("EarlyStopping", self.mode)
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1:
            raise ValueError(f"EarlyStopping patience expects an int >= 1 (epochs); found {self.patience!r}.")
        if isinstance(self.min_delta, bool) or not isinstance(self.min_delta, (int, float)) \
                or not 0 <= self.min_delta < math.inf:
            raise ValueError(f"EarlyStopping min_delta expects a number >= 0; found {self.min_delta!r}.")
        if not isinstance(self.restore_best, bool):
            raise TypeError(f"EarlyStopping restore_best expects True or False; found {self.restore_best!r}.")

    def initial_state(self) -> dict:
        worst = math.inf if resolved_mode(self.monitor, self.mode) == "min" else -math.inf
        return {"best": worst, "best_epoch": 0, "wait": 0}

    def after_epoch(self, state: dict, record: dict, weights) -> Outcome:
        mode, value = resolved_mode(self.monitor, self.mode), record[self.monitor]
        if _better(mode, value, state["best"], self.min_delta):
            keep = {"weights": weights()} if self.restore_best else None
            return Outcome({"best": value, "best_epoch": record["epoch"], "wait": 0}, keep=keep)
        state = dict(state, wait=state["wait"] + 1)
        if state["wait"] < self.patience:
            return Outcome(state)
        why = (f"early stopping: {self.monitor} did not improve for {self.patience} epoch"
               f"{'s' if self.patience > 1 else ''} (best {state['best']:.4g} at epoch {state['best_epoch']}"
               + ("; its weights restored)" if self.restore_best and state["best_epoch"] else ")"))
        return Outcome(state, stop=why, restore=self.restore_best and state["best_epoch"] > 0)


@dataclass(frozen=True)
class ModelCheckpoint:
    """Keep the ``keep`` best checkpoints by ``monitor`` as ``best-epoch007.safetensors`` in ``folder``
    (default: the folder of `.checkpoint(path)`, the run folder of ``blueprint train``); a checkpoint
    that falls out of the best ``keep`` is deleted. Each is a full task checkpoint (`Model.load`,
    `DeepLearningTask.load` and ``resume`` read it). Ties keep the earlier epoch.

    >>> task = (DeepLearningTask().checkpoint("run/checkpoint.safetensors")   # doctest: +SKIP
    ...         .callback(ModelCheckpoint(keep=2)))
    """

    monitor: str = "val_loss"
    keep: int = 1
    mode: str = "auto"
    folder: str | None = None

    def __post_init__(self):
        _monitor("ModelCheckpoint", self.monitor)
        _mode("ModelCheckpoint", self.mode)
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
            raise ValueError(f"ModelCheckpoint keep expects an int >= 1 (checkpoints); found {self.keep!r}.")
        if self.folder is not None:
            object.__setattr__(self, "folder", str(self.folder))

    def initial_state(self) -> dict:
        return {"best": []}

    def after_epoch(self, state: dict, record: dict, weights) -> Outcome:
        value, epoch = record[self.monitor], record["epoch"]
        if not math.isfinite(value):
            return Outcome(state)
        sign = 1 if resolved_mode(self.monitor, self.mode) == "min" else -1
        name = BEST_NAME.format(epoch=epoch)
        ranked = sorted(state["best"] + [[value, epoch, name]], key=lambda entry: (sign * entry[0], entry[1]))
        kept, dropped = ranked[:self.keep], ranked[self.keep:]
        if [value, epoch, name] not in kept:
            return Outcome(state)
        return Outcome({"best": kept}, write=name, remove=tuple(entry[2] for entry in dropped))


TRACKED_CALLBACKS = (EarlyStopping, ModelCheckpoint)


@dataclass
class Tracked:
    """The session's part: states by key, kept tensors by key, and why training stopped."""

    states: dict = field(default_factory=dict)   # key -> {"config": repr, "state": dict}
    kept: dict = field(default_factory=dict)     # key -> {name: array}
    stopped: str | None = None

    def state(self, key: str, value, initial) -> dict:
        entry = self.states.get(key)
        return entry["state"] if entry is not None and entry["config"] == repr(value) else initial()


def tracked_callbacks(task) -> dict:
    tracked = [fn for fn in task.callbacks if isinstance(fn, TRACKED_CALLBACKS)]
    return {f"callback{i}": fn for i, fn in enumerate(tracked)}


def check_tracked(task) -> None:
    """Refuse, before any work, a tracked value that watches a metric the run will not have."""
    watchers = list(tracked_callbacks(task).values())
    if hasattr(task.scheduler_config, "initial_state"):
        watchers.append(task.scheduler_config)
    for value in watchers:
        monitor = value.monitor_name if isinstance(value, ReduceLROnPlateau) else value.monitor
        if monitor.startswith("val_") and task.val_set is None:
            raise ConfigError(f"{type(value).__name__} watches {monitor} but the task has no validation set; pass "
                              f".data(val=...) (or a validation_split of the training data), or watch "
                              f"{monitor.replace('val_', 'train_')}")
        if monitor == "val_top5" and task.train_set is not None and task.train_set.num_classes < 5:
            raise ConfigError(f"{type(value).__name__} watches val_top5 but the data has "
                              f"{task.train_set.num_classes} classes (top-5 needs >= 5); watch val_accuracy")
        if isinstance(value, ModelCheckpoint) and value.folder is None and task.checkpoint_path is None:
            raise ConfigError("ModelCheckpoint has no folder to write into: pass ModelCheckpoint(folder=...) or set "
                              ".checkpoint(path) (its folder is used)")


def scheduled_lr(task, session, epoch: int, step: int, steps: int) -> float:
    """The learning rate of a step: a plain schedule's function of position, or a tracked one's state."""
    schedule = task.scheduler_config
    if not hasattr(schedule, "initial_state"):
        return schedule.lr_at(epoch, step, steps, task.base_lr, task.epoch_count)
    state = session.tracked.state("scheduler", schedule, lambda: schedule.initial_state(task.base_lr))
    return schedule.lr_at(epoch, step, steps, task.base_lr, task.epoch_count, state)


def after_epoch(task, session, record) -> list[str]:
    """Advance every tracked value with the epoch's record; returns messages to print. Runs on every
    replica (the record is reduced over them); only the writer touches files."""
    tracked, values, messages = session.tracked, record.as_dict(), []
    schedule = task.scheduler_config
    if hasattr(schedule, "initial_state"):
        state = tracked.state("scheduler", schedule, lambda: schedule.initial_state(task.base_lr))
        new = schedule.after_epoch(state, values)
        tracked.states["scheduler"] = {"config": repr(schedule), "state": new}
        if new["lr"] != state["lr"]:
            messages.append(f"ReduceLROnPlateau: {schedule.monitor_name} has not improved; lr {state['lr']:.4g} -> "
                            f"{new['lr']:.4g}")
    files = []
    for key, callback in tracked_callbacks(task).items():
        state = tracked.state(key, callback, callback.initial_state)
        if tracked.states.get(key, {}).get("config") != repr(callback):
            tracked.kept.pop(key, None)
        outcome = callback.after_epoch(state, values, session.executor.state_dict)
        tracked.states[key] = {"config": repr(callback), "state": outcome.state}
        if outcome.keep is not None:
            tracked.kept[key] = outcome.keep["weights"]
        if outcome.restore:
            session.executor.load_state_dict(tracked.kept[key])
        if outcome.stop and tracked.stopped is None:
            tracked.stopped = outcome.stop
            messages.append(outcome.stop)
        if outcome.write or outcome.remove:
            folder = Path(callback.folder) if callback.folder is not None else Path(task.checkpoint_path).parent
            files.append((folder, outcome.write, outcome.remove))
    if task._writes:
        for folder, write, remove in files:
            if write:
                folder.mkdir(parents=True, exist_ok=True)
                task.save(folder / write)
            for name in remove:
                (folder / name).unlink(missing_ok=True)
    return messages


def checkpoint_entries(session) -> tuple[dict, dict]:
    """(JSON state entries, tensors) that `save` adds to a checkpoint."""
    tracked = session.tracked
    tensors = {f"{KEPT_PREFIX}{key}.{name}": value
               for key, kept in tracked.kept.items() for name, value in kept.items()}
    return {"tracked": tracked.states, "stopped": tracked.stopped}, tensors


def read_tracked(path, state: dict, tensors: dict) -> Tracked:
    """The tracked part of a checkpoint, validated (a checkpoint written before callbacks were tracked
    has none: everything starts afresh)."""
    states, stopped = state.get("tracked", {}), state.get("stopped")
    if not isinstance(states, dict) or any(not isinstance(entry, dict) or not isinstance(entry.get("config"), str)
                                           or not isinstance(entry.get("state"), dict) for entry in states.values()):
        raise ConfigError(f"{path}: the checkpoint's tracked callback state is malformed ({str(states)[:80]}); "
                          "use another checkpoint")
    if stopped is not None and not isinstance(stopped, str):
        raise ConfigError(f"{path}: the checkpoint's 'stopped' entry must be a message or null, found {stopped!r}")
    kept = {}
    for name, value in tensors.items():
        if name.startswith(KEPT_PREFIX):
            key, _, parameter = name[len(KEPT_PREFIX):].partition(".")
            kept.setdefault(key, {})[parameter] = value
    return Tracked(dict(states), kept, stopped)
