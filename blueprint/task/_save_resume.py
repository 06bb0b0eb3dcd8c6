"""`save`, `resume` and `load` of `DeepLearningTask` (a mixin): one safetensors file holds the weights,
the optimizer state and the exact position; everything is checked before anything is loaded.
"""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Self

import numpy as np

from blueprint._errors import ConfigError
from blueprint._layer import BluePrint
from blueprint._parse import parse_as
from blueprint.optim import SCHEDULES, SGD, Adam, AdamW, CrossEntropyLoss
from blueprint.task._callbacks import checkpoint_entries, read_tracked
from blueprint.task._checkpoint import checkpoint_lock, load_checkpoint, save_checkpoint
from blueprint.task._fit_loop import EpochRecord
from blueprint.task._position import Position, check_resumable
from blueprint.task._replica_task import check_world_size, resumed_position

CHECKPOINT_FORMAT = "blueprint-task-2"   # 2: position, sample shape


class SaveResume:
    """Checkpoints of `DeepLearningTask`."""

    def save(self, path) -> Path:
        """Write weights, BN statistics, optimizer state and position as one safetensors file (atomically).
        Mid-epoch (after an interrupt) the position records the next batch and the epoch's sums so far.
        A path another process is saving to (its `fit()` or `save()`) is refused, naming that process."""
        session = self.session()
        ex = session.executor
        tensors = {"model." + k: v for k, v in ex.state_dict().items()}
        tensors.update({"optim." + k: v for k, v in ex.optimizer_state().items()})
        position = session.position if session.position is not None and session.position.started else None
        state = {"format": CHECKPOINT_FORMAT, "blueprint": repr(self.blueprint_value),
                 "optimizer": repr(self.optimizer_config), "loss": repr(self.loss_config),
                 "scheduler": repr(self.scheduler_config), "epochs_done": session.epochs_done,
                 "epochs": self.epoch_count, "batch_size": self.batch, "seed": self.seed_value,
                 "sample_shape": list(self.train_set.sample_shape), "input": self._input_spec().as_state(),
                 "position": None if position is None else position.as_state(),
                 "world_size": 1 if self.distributed_config is None else self.distributed_config.world_size,
                 "history": [r.as_dict() for r in session.history]}
        tracked_state, tracked_tensors = checkpoint_entries(session)
        state.update(tracked_state)
        tensors.update(tracked_tensors)
        path = Path(path)
        with checkpoint_lock(path):
            save_checkpoint(path, tensors, state)
        return path

    def _input_spec(self):
        """The input the network was trained on, stored with the weights: layout, dtype, normalisation.
        Measured once per training set (a pass over CIFAR-10 takes seconds), not at every save."""
        from blueprint._model import InputSpec
        session = self.session()
        measured = (self.train_set, repr(self.normalisation))
        if session.input_spec and session.input_spec[0] is measured[0] and session.input_spec[1] == measured[1]:
            return session.input_spec[2]
        _, _, (mean, std) = self._loaders()
        x = self.train_set.x
        flat = x.reshape(-1, x.shape[-1]) if x.dtype == np.float32 and len(x) else None
        spec = InputSpec(self.train_set.sample_shape, str(x.dtype), mean, std,
                         None if flat is None else tuple(flat.min(axis=0)),
                         None if flat is None else tuple(flat.max(axis=0)))
        session.input_spec = measured + (spec,)
        return spec

    def _inference_model(self):
        from blueprint._model import Model
        if not self._session or not self._session[0].holds_training:
            raise ConfigError("task.model() returns the trained network: call fit() (or resume(path)) first; "
                              "to set the network use .model(bp)")
        model = Model(self.blueprint_value, self._input_spec(), seed=self.seed_value)
        return model.load_state_dict(self._session[0].executor.state_dict())

    def resume(self, path) -> Self:
        """Load a checkpoint into this task's session; `fit()` then continues where it stopped (at the
        next batch, for an interrupt checkpoint). Everything is checked before anything is loaded: a
        checkpoint of another model, loss, optimizer kind, scheduler, batch size, input shape or seed
        is refused naming the field, and a refused resume leaves the task exactly as it was."""
        tensors, state = load_checkpoint(path)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ConfigError(f"{path}: not a DeepLearningTask checkpoint of this version (format "
                              f"{state.get('format')!r}, expected {CHECKPOINT_FORMAT!r})")
        self.validate()
        self._check_resumable(path, state)
        check_world_size(path, state.get("world_size", 1), self.distributed_config)
        session = self._session[0] if self._session else self._new_session()
        weights = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
        optimizer_state = {k[len("optim."):]: v for k, v in tensors.items() if k.startswith("optim.")}
        session.executor.check_state_dict(weights)
        session.executor.check_optimizer_state(optimizer_state)
        epochs_done = _count(path, state, "epochs_done", 0)
        history = _history(path, state.get("history"))
        if epochs_done != len(history):   # every finished epoch appends its record before the save
            raise ConfigError(f"{path}: the checkpoint's epochs_done is {epochs_done:,} but its history holds "
                              f"{len(history)} epoch record(s); the file was edited or written by another "
                              "program. Resume from another checkpoint (e.g. the previous epoch's)")
        position = Position.from_state(path, state.get("position"), epochs_done,
                                       self._loaders()[0].steps_per_epoch)
        if position is not None and self.distributed_config is not None:
            position = resumed_position(self.distributed_config, position)
        tracked = read_tracked(path, state, tensors)
        # everything checked: only now change the session
        session.executor.load_state_dict(weights)
        session.executor.load_optimizer_state(optimizer_state)
        session.epochs_done, session.history, session.position, session.resumed = epochs_done, history, position, True
        session.tracked = tracked
        if not self._session:
            self._session.append(session)
        return self

    def _check_resumable(self, path, state: dict) -> None:
        optimizer = parse_as(state.get("optimizer"), f"{path}: optimizer", (SGD, Adam, AdamW))
        recorded = {"model": state.get("blueprint"), "loss": state.get("loss"),
                    "optimizer kind": type(optimizer).__name__, "scheduler": state.get("scheduler"),
                    "batch size": state.get("batch_size"), "input shape (H, W, C)": tuple(state.get("sample_shape", ())),
                    "seed": state.get("seed")}
        current = {"model": repr(self.blueprint_value), "loss": repr(self.loss_config),
                   "optimizer kind": type(self.optimizer_config).__name__, "scheduler": repr(self.scheduler_config),
                   "batch size": self.batch, "input shape (H, W, C)": self.train_set.sample_shape,
                   "seed": self.seed_value}
        fixes = {"model": "resume with the same model (DeepLearningTask.load(path) rebuilds the task the checkpoint "
                          "was trained with), or start a new run in another --out folder",
                 "loss": f"configure the checkpoint's loss: .loss({recorded['loss']})",
                 "optimizer kind": f"use the checkpoint's optimizer (--optimizer {recorded['optimizer kind'].lower()}, "
                                   f"or .optimizer({state.get('optimizer')}))",
                 "scheduler": f"configure the checkpoint's scheduler: .scheduler({recorded['scheduler']})",
                 "batch size": f"use --batch-size {recorded['batch size']} (or .data(..., batch_size="
                               f"{recorded['batch size']}))",
                 "input shape (H, W, C)": "resume on data of the shape the checkpoint was trained on",
                 "seed": f"use --seed {recorded['seed']} (or .seed({recorded['seed']}))"}
        check_resumable(path, recorded, current, fixes)

    @classmethod
    def load(cls, path) -> Self:
        """A task rebuilt from a checkpoint (model, loss, optimizer, scheduler, epochs, seed, batch size);
        attach data with `.data(...)`, then `.resume(path)` to restore the weights."""
        _, state = load_checkpoint(path)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ConfigError(f"{path}: not a DeepLearningTask checkpoint (format {state.get('format')!r})")
        # parsed, never evaluated: a checkpoint cannot run code
        return (cls().model(parse_as(state.get("blueprint"), f"{path}: model", (BluePrint,)))
                .loss(parse_as(state.get("loss"), f"{path}: loss", (CrossEntropyLoss,)))
                .optimizer(parse_as(state.get("optimizer"), f"{path}: optimizer", (SGD, Adam, AdamW)))
                .scheduler(parse_as(state.get("scheduler"), f"{path}: scheduler", SCHEDULES))
                .epochs(_count(path, state, "epochs", 1)).seed(_count(path, state, "seed", 0))
                ._new(batch=_count(path, state, "batch_size", 1)))


def _count(path, state: dict, key: str, minimum: int) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{path}: the checkpoint's {key} must be an int >= {minimum}, found {value!r}")
    return value


def _history(path, records) -> list[EpochRecord]:
    names = sorted(f.name for f in fields(EpochRecord))
    if not isinstance(records, list) or any(not isinstance(r, dict) or sorted(r) != names for r in records):
        raise ConfigError(f"{path}: the checkpoint's history must be a list of epoch records with fields {names}")
    return [EpochRecord(**r) for r in records]
