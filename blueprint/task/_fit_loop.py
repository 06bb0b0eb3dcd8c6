"""`fit()`'s loop, mixed into `DeepLearningTask`: epochs, the training steps of an epoch (step k+1
submitted before step k's result is read), validation, the per-epoch record and the console.
"""
from __future__ import annotations

import json
import math
import time
from collections import deque
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from blueprint.task._callbacks import StopTraining, after_epoch, scheduled_lr
from blueprint.task._checkpoint import first_non_finite
from blueprint.task._console import Console
from blueprint.task._position import DeferredInterrupt, Position, interrupt_path
from blueprint.task._replica_task import epoch_sums, reduce_metrics, stop_replicas_on_error


VALIDATION_METRICS = ("loss", "top1", "top5")


class DivergedError(FloatingPointError, ValueError):
    """The training loss became NaN or Inf: the learning rate or the data, not a bug."""


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    lr: float
    train_loss: float
    train_accuracy: float
    val_loss: float | None
    val_accuracy: float | None
    val_top5: float | None
    seconds: float
    images_per_second: float

    def metrics(self) -> dict:
        """Everything but the timings: bit-identical between runs with the same seed on CPU."""
        return {k: v for k, v in self.as_dict().items() if k not in ("seconds", "images_per_second")}

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class FitLoop:
    """The training loop of `DeepLearningTask` (a mixin: the task's configuration fields are its state)."""

    def _fit(self, session, interrupt: DeferredInterrupt) -> list[EpochRecord]:
        with Console(self.show_progress and self._writes) as console, stop_replicas_on_error(self.distributed_config):
            return self._fit_epochs(session, interrupt, console)

    def _fit_epochs(self, session, interrupt: DeferredInterrupt, console: Console) -> list[EpochRecord]:
        loader, val_loader, _ = self._loaders()
        steps = loader.steps_per_epoch
        for epoch in range(session.epochs_done, self.epoch_count):
            if session.tracked.stopped:   # a callback ended the run (perhaps before an interrupt and resume)
                break
            start = time.perf_counter()
            resumed = session.position is not None and session.position.epoch == epoch
            position = session.position if resumed else Position(epoch, lr=self.base_lr)
            session.position = position
            order = loader.order(epoch)
            console.begin_epoch(steps, position.batch, f"epoch {epoch + 1}/{self.epoch_count}")
            try:
                position = self._train_steps(session, interrupt, loader, order, position, console, start)
            finally:
                console.close_bar()
            train_seconds = time.perf_counter() - start - console.epoch_compile_seconds()   # img/s without compiling
            seen, correct, loss_sum = position.seen, position.correct, position.loss_sum
            if self.distributed_config is not None:   # the epoch's sums over every replica; rank 0's BN statistics
                seen, correct, loss_sum = epoch_sums(self.distributed_config, session.executor, position)
            val = self._evaluate_loader(session, val_loader, interrupt) if val_loader is not None else None
            refuse_non_finite(epoch + 1, val, session.executor.state_dict())
            record = EpochRecord(epoch + 1, float(position.lr), loss_sum / seen, correct / seen,
                                 val["loss"] if val else None, val["top1"] if val else None,
                                 val.get("top5") if val else None, time.perf_counter() - start, seen / train_seconds)
            session.history.append(record)
            console.epoch_done(record, self.epoch_count, steps, console.epoch_compile_seconds())
            session.epochs_done, session.position = epoch + 1, None
            for message in after_epoch(self, session, record):   # before the checkpoint, which holds their state
                console.say(message)
            if not self._writes:   # rank 0 alone writes the log and checkpoints and runs the callbacks
                continue
            if self.log_path:
                with open(self.log_path, "a", encoding="utf-8") as log:
                    log.write(json.dumps(record.as_dict()) + "\n")
            if self.checkpoint_path:
                self.save(self.checkpoint_path)
                interrupt_path(Path(self.checkpoint_path)).unlink(missing_ok=True)   # superseded
            self._call_functions(session, record, console)
            interrupt.check()
        return list(session.history)

    def _call_functions(self, session, record: EpochRecord, console: Console) -> None:
        """The plain callbacks; one raising StopTraining (or StopIteration) ends the run after this epoch."""
        for fn in self.callbacks:
            if not callable(fn):
                continue
            try:
                fn(record)
            except (StopTraining, StopIteration) as stop:
                if session.tracked.stopped is None:
                    session.tracked.stopped = str(stop) or f"stopped by callback {getattr(fn, '__name__', fn)!r}"
                    console.say(session.tracked.stopped)
                    if self.checkpoint_path:   # the stop is part of the run's state
                        self.save(self.checkpoint_path)

    def _train_steps(self, session, interrupt: DeferredInterrupt, loader, order, position: Position,
                     console: Console, start: float) -> Position:
        """The epoch's remaining steps, from `position`. Step k+1 is submitted before step k's result is
        read, so a device runs step k while the host prepares and stages batch k+1 (a synchronous
        executor has finished each step by the time it returns). The position counts a step once its
        result is read; on an interrupt outside an executor call every submitted step is read first,
        so the position saved with the weights is exact."""
        epoch, steps, executor = position.epoch, loader.steps_per_epoch, session.executor
        seen_before = position.seen     # samples of this epoch trained before a resume
        in_flight = deque()             # (step, lr, batch size, pending result), oldest first

        def finish_oldest(position: Position) -> Position:
            step, lr, size, pending = in_flight[0]
            interrupt.stepping = True   # a second Ctrl-C while waiting: position and weights may disagree
            loss, correct = pending.result()
            if not math.isfinite(loss):
                raise DivergedError(f"training diverged at epoch {epoch + 1}, step {step}: the loss became "
                                    f"{loss}; lower the learning rate (now {lr:g}) or check the data")
            position = session.position = position.after_step(size, loss, correct, lr)
            in_flight.popleft()
            interrupt.stepping = False
            console.batch_done(position, seen_before, start)
            return position

        try:
            for step in range(position.batch, steps):
                interrupt.check()
                x, y = loader.batch(epoch, step, order)
                lr = scheduled_lr(self, session, epoch, step, steps)
                interrupt.stepping = True    # the executor is changing the weights
                in_flight.append((step, lr, len(y), executor.submit_train_step(x, y, lr)))
                interrupt.stepping = False
                if len(in_flight) > 1:
                    position = finish_oldest(position)
        except KeyboardInterrupt:
            while in_flight and not interrupt.stepping:    # the submitted steps have run or will: count them
                position = finish_oldest(position)
            raise
        while in_flight:
            position = finish_oldest(position)
        return position

    def _evaluate_loader(self, session, loader, interrupt: DeferredInterrupt | None = None) -> dict:
        logits, labels = [], []
        for x, y in loader.epoch(0):
            logits.append(self._forward_padded(session, x))
            labels.append(y)
            if interrupt is not None:
                interrupt.check()
        metrics = classification_metrics(np.concatenate(logits), np.concatenate(labels), self.loss_config.smoothing)
        return metrics if self.distributed_config is None else reduce_metrics(self.distributed_config, metrics)

    def _forward_padded(self, session, x: np.ndarray) -> np.ndarray:
        """Eval logits for any batch size: eval-mode layers act per sample, so a batch is split
        into compiled eval shapes and the last piece padded with zeros."""
        shapes = {v.input_shape[0] for v in session.plan.variants.values() if v.graph == "eval"}
        out = []
        full = session.eval_batch
        for start in range(0, len(x), full):
            piece = x[start:start + full]
            if len(piece) not in shapes:
                padded = np.zeros((full,) + piece.shape[1:], np.float32)
                padded[:len(piece)] = piece
                out.append(session.executor.forward(padded)[:len(piece)])
            else:
                out.append(session.executor.forward(np.ascontiguousarray(piece)))
        return np.concatenate(out).astype(np.float32)


def refuse_non_finite(epoch: int, val: dict | None, state: dict[str, np.ndarray]) -> None:
    """A NaN/Inf validation metric or model tensor fails the run at `epoch`, before the epoch's record, log
    line or checkpoint exist: the previous epoch's checkpoint stays the last, finite one."""
    for metric in VALIDATION_METRICS:
        value = (val or {}).get(metric)
        if value is not None and not math.isfinite(value):
            raise DivergedError(f"training diverged at epoch {epoch}: the validation {metric} is {value}; "
                                "lower the learning rate or check the data (the checkpoint keeps the last finished "
                                "epoch that was finite)")
    bad = first_non_finite(state)
    if bad is not None:
        raise DivergedError(f"training diverged at epoch {epoch}: model tensor {bad[0]!r} holds {bad[1]} NaN/Inf "
                            "value(s); lower the learning rate or normalise the inputs (the checkpoint keeps the "
                            "last finished epoch that was finite)")


def classification_metrics(logits: np.ndarray, labels: np.ndarray, smoothing: float = 0.0) -> dict:
    """Mean cross-entropy (PyTorch's label smoothing), top-1 and, with >= 5 classes, top-5 accuracy."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    nll = -logp[np.arange(len(labels)), labels]
    loss = (1 - smoothing) * nll - smoothing * logp.mean(axis=1)
    out = {"loss": float(loss.mean()), "top1": float((logits.argmax(axis=1) == labels).mean()), "samples": len(labels)}
    if logits.shape[1] >= 5:
        top5 = np.argsort(-logits, axis=1, kind="stable")[:, :5]
        out["top5"] = float((top5 == labels[:, None]).any(axis=1).mean())
    return out
