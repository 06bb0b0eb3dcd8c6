"""`DeepLearningTask`: the chained training API.

Configuration is an immutable value: every setter returns a new task. `fit()` compiles the
variants it needs once (train, the last partial train batch unless `drop_last`, eval, the
last partial eval batch), creates the executor for `.device()`, and trains; the trained
session stays attached to that task value for `evaluate()`, `predict()` and `save()`.
"""
from __future__ import annotations

import json
import math
import time
from collections import deque
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from blueprint._errors import ConfigError
from blueprint._layer import BluePrint
from blueprint._parse import parse_as
from blueprint.optim import (SGD, Adam, AdamW, ConstantLR, CosineAnnealingLR, CrossEntropyLoss, MultiStepLR, StepLR,
                             keyword_construction)
from blueprint.task._checkpoint import load_checkpoint, save_checkpoint
from blueprint.task._console import Console
from blueprint.task._replica_task import (check_replica_batch, check_world_size, epoch_sums, place_replica,
                                          reduce_metrics, replica_loaders, replica_samples, replicate,
                                          resumed_position, stop_replicas_on_error)
from blueprint.task._position import DeferredInterrupt, Position, check_resumable, interrupt_path
from blueprint.task.data import ArrayDataset, Augment, DataLoader

if TYPE_CHECKING:
    from blueprint._model import Model

DEVICES = ("cpu", "cuda")
CHECKPOINT_FORMAT = "blueprint-task-2"   # 2: position, sample shape


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


@dataclass
class _Session:
    """The mutable part: compiled plan, executor, position in training, history."""

    plan: object
    executor: object
    eval_batch: int
    epochs_done: int = 0
    history: list = field(default_factory=list)
    position: Position | None = None   # mid-epoch: where the epoch in progress stands
    resumed: bool = False
    input_spec: tuple = ()             # (train set, repr of normalisation, InputSpec): measured once per data

    @property
    def holds_training(self) -> bool:
        """True once the weights are worth keeping: trained, or loaded from a checkpoint."""
        return self.resumed or self.executor.step_count > 0


@dataclass(frozen=True)
class DeepLearningTask:
    """Train a BluePrint.

    >>> from blueprint import zoo
    >>> from blueprint.optim import SGD, CrossEntropyLoss, CosineAnnealingLR
    >>> from blueprint.task.data import digits
    >>> train, val = digits()
    >>> task = (DeepLearningTask().model(zoo.small_cnn()).loss(CrossEntropyLoss())
    ...         .optimizer(SGD().momentum(0.9)).scheduler(CosineAnnealingLR().base_lr(0.05))
    ...         .data(train=train, val=val, batch_size=64).epochs(1).progress(False))
    >>> history = task.fit()                                  # doctest: +SKIP
    >>> task.evaluate(val)["top1"] > 0.5                      # doctest: +SKIP
    True
    """

    blueprint_value: BluePrint | None = None
    loss_config: CrossEntropyLoss = CrossEntropyLoss()
    optimizer_config: object = SGD()
    scheduler_config: object = ConstantLR()
    train_set: ArrayDataset | None = None
    val_set: ArrayDataset | None = None
    batch: int = 128
    eval_batch: int | None = None
    augmentation: Augment | None = None
    normalisation: object = "auto"    # "auto": the train set's channel stats; None; or (mean, std)
    epoch_count: int = 1
    device_name: str = "cpu"
    amp_enabled: bool | None = None   # None: the device's default (cpu: False, cuda: True)
    fuse_enabled: bool | None = None
    seed_value: int = 0
    drop_last_batch: bool = False
    show_progress: bool = True
    callbacks: tuple = ()
    log_path: str | None = None
    checkpoint_path: str | None = None
    distributed_config: object = None   # a blueprint.distributed.Distributed: this process's replica
    _session: list = field(default_factory=list, compare=False, repr=False)

    # ---- chained setters ------------------------------------------------------------------------------
    def model(self, bp: BluePrint | None = None) -> "DeepLearningTask | Model":
        """`.model(bp)` sets the network (a new task); `.model()` returns the trained network as a
        `blueprint.Model` (weights, BluePrint and the input normalisation) for inference and export."""
        if bp is None:
            return self._inference_model()
        if not isinstance(bp, BluePrint):
            raise TypeError(f"DeepLearningTask.model(bp): expected a BluePrint (e.g. zoo.resnet20()), got {type(bp).__name__}")
        return self._new(blueprint_value=bp)

    def loss(self, loss: CrossEntropyLoss) -> "DeepLearningTask":
        if not isinstance(loss, CrossEntropyLoss):
            raise TypeError(f"DeepLearningTask.loss(loss): expected CrossEntropyLoss(), got {type(loss).__name__}")
        return self._new(loss_config=loss)

    def optimizer(self, opt) -> "DeepLearningTask":
        if not isinstance(opt, (SGD, Adam, AdamW)):
            raise TypeError(f"DeepLearningTask.optimizer(opt): expected SGD(), Adam() or AdamW(), got {type(opt).__name__}")
        return self._new(optimizer_config=opt.validate())

    def scheduler(self, schedule) -> "DeepLearningTask":
        if not isinstance(schedule, (ConstantLR, StepLR, MultiStepLR, CosineAnnealingLR)):
            raise TypeError("DeepLearningTask.scheduler(s): expected ConstantLR(), StepLR(), MultiStepLR() or "
                            f"CosineAnnealingLR(), got {type(schedule).__name__}")
        return self._new(scheduler_config=schedule.validate())

    def data(self, train: ArrayDataset | None = None, val: ArrayDataset | None = None, batch_size: int | None = None,
             eval_batch_size: int | None = None, augment: Augment | None = None, normalize="auto") -> "DeepLearningTask":
        for name, value in (("train", train), ("val", val)):
            if value is not None and not isinstance(value, ArrayDataset):
                raise TypeError(f"DeepLearningTask.data({name}=...): expected an ArrayDataset, got {type(value).__name__}")
        for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ConfigError(f"DeepLearningTask.data({name}=...): expected a positive int, got {value!r}")
        if not (normalize is None or (isinstance(normalize, str) and normalize == "auto")
                or (isinstance(normalize, tuple) and len(normalize) == 2)):
            raise ConfigError(f"DeepLearningTask.data(normalize=...): expected 'auto' (the train set's channel "
                              f"statistics), None (no normalisation) or a (mean, std) pair, got {normalize!r}")
        return self._new(train_set=train, val_set=val, batch=batch_size or self.batch,
                         eval_batch=eval_batch_size, augmentation=augment, normalisation=normalize)

    def epochs(self, n: int) -> "DeepLearningTask":
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"DeepLearningTask.epochs(n): expected a positive int, got {n!r}")
        return self._new(epoch_count=n)

    def device(self, name: str) -> "DeepLearningTask":
        """"cpu" or "cuda"; "cuda:0" (PyTorch's spelling) means "cuda" (one GPU: index 0 only)."""
        if isinstance(name, str) and name.startswith("cuda:"):
            if name != "cuda:0":
                raise ConfigError(f"DeepLearningTask.device(name): only GPU index 0 is supported, got {name!r}; "
                                  f"pick the GPU with CUDA_VISIBLE_DEVICES={name[5:]} and pass 'cuda'")
            name = "cuda"
        if name not in DEVICES:
            raise ConfigError(f"DeepLearningTask.device(name): expected one of {DEVICES} (or 'cuda:0'), got {name!r}")
        return self._new(device_name=name)

    def amp(self, enabled: bool) -> "DeepLearningTask":
        return self._new(amp_enabled=_flag("amp", enabled))

    def fuse(self, enabled: bool) -> "DeepLearningTask":
        return self._new(fuse_enabled=_flag("fuse", enabled))

    def seed(self, value: int) -> "DeepLearningTask":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"DeepLearningTask.seed(value): expected an int >= 0, got {value!r}")
        return self._new(seed_value=value)

    def drop_last(self, enabled: bool = True) -> "DeepLearningTask":
        return self._new(drop_last_batch=_flag("drop_last", enabled))

    def progress(self, enabled: bool) -> "DeepLearningTask":
        return self._new(show_progress=_flag("progress", enabled))

    def callback(self, fn: Callable[[EpochRecord], None]) -> "DeepLearningTask":
        """Add a function called with each epoch's `EpochRecord` after it ends."""
        if not callable(fn):
            raise TypeError(f"DeepLearningTask.callback(fn): expected a callable, got {fn!r}")
        return self._new(callbacks=self.callbacks + (fn,))

    def log(self, path) -> "DeepLearningTask":
        """Append one JSON line per epoch to `path`."""
        return self._new(log_path=None if path is None else str(path))

    def checkpoint(self, path) -> "DeepLearningTask":
        """Save a checkpoint to `path` after every epoch, and when training is interrupted (Ctrl-C)."""
        return self._new(checkpoint_path=None if path is None else str(path))

    def distributed(self, enabled: bool = True, sync_batchnorm: bool = False,
                    timeout_s: float | None = None) -> "DeepLearningTask":
        """Data-parallel training: this process is one replica of the run torchrun started (rank and
        world size from its environment). ``batch_size`` stays the global batch (each rank trains on
        ``batch_size / world_size`` samples of a disjoint shard); BN is per replica unless
        ``sync_batchnorm``; a collective waiting longer than ``timeout_s`` seconds ends the run.

        >>> task = DeepLearningTask().model(zoo.small_cnn()).distributed()   # doctest: +SKIP
        """
        from blueprint.distributed import DEFAULT_TIMEOUT_S, Distributed
        if not _flag("distributed", enabled):
            return self._new(distributed_config=None)
        return self._new(distributed_config=Distributed.from_environment(
            DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s, _flag("distributed", sync_batchnorm)))

    def _new(self, **changes) -> "DeepLearningTask":
        """The changed value. A trained (or resumed) session carries over when the change leaves what
        it was compiled for alone; a change that would drop trained weights is refused."""
        changed = replace(self, _session=[], **changes)
        if not self._session:
            return changed
        before, after = self._session_key(), changed._session_key()
        if before == after:
            return replace(self, _session=self._session, **changes)   # shares the session
        if not self._session[0].holds_training:
            return changed
        what = next(name for name in before if before[name] != after[name])
        raise ConfigError(f"this task holds trained weights and the change would alter its {what} "
                          f"({_short(before[what])} -> {_short(after[what])}), which needs a new session; call "
                          "task.save(path) first, then build a new task (DeepLearningTask.load(path) rebuilds one)")

    def _session_key(self) -> dict:
        """Everything the compiled plan and the executor depend on."""
        return {"model": self.blueprint_value, "loss": self.loss_config, "optimizer": self.optimizer_config,
                "device": self.device_name, "amp": self.use_amp, "fuse": self.use_fuse, "seed": self.seed_value,
                "compiled shapes": self._variants() if self.train_set is not None else None,
                "data-parallel replica": self.distributed_config}

    # ---- derived settings -------------------------------------------------------------------------------
    @property
    def use_amp(self) -> bool:
        return self.device_name == "cuda" if self.amp_enabled is None else self.amp_enabled

    @property
    def use_fuse(self) -> bool:
        return self.device_name == "cuda" if self.fuse_enabled is None else self.fuse_enabled

    @property
    def base_lr(self) -> float:
        own = self.scheduler_config.base_learning_rate
        return self.optimizer_config.learning_rate if own is None else own

    @property
    def _writes(self) -> bool:
        """Whether this process writes the console, log, checkpoints (rank 0 of a data-parallel run)."""
        return self.distributed_config is None or self.distributed_config.is_writer

    @property
    def history(self) -> list[EpochRecord]:
        return list(self._session[0].history) if self._session else []

    def validate(self) -> "DeepLearningTask":
        """Check the whole configuration before any work starts."""
        if self.blueprint_value is None:
            raise ConfigError("no model: call .model(bp) with a BluePrint, e.g. .model(zoo.small_cnn())")
        if self.blueprint_value.empty:
            raise ConfigError("the model's BluePrint is empty")
        if self.train_set is None:
            raise ConfigError("no training data: call .data(train=ArrayDataset(x, y), val=..., batch_size=...)")
        if self.val_set is not None and self.val_set.sample_shape != self.train_set.sample_shape:
            raise ConfigError(f"train samples are {self.train_set.sample_shape} (H, W, C) but val samples are "
                              f"{self.val_set.sample_shape}; both sets must have one shape")
        if self.distributed_config is not None:
            check_replica_batch(self.distributed_config, self.batch, len(self.train_set), self.drop_last_batch)
        if self.drop_last_batch and len(self.train_set) < self.batch:
            raise ConfigError(f"drop_last with batch_size={self.batch} would drop every one of the "
                              f"{len(self.train_set)} training samples; lower the batch size")
        if self.use_fuse and not self.use_amp:
            raise ConfigError("fuse(True) needs amp(True): the fused kernels are fp16")
        if self.device_name == "cpu" and (self.use_amp or self.use_fuse):
            raise ConfigError("the CPU path is the fp32 unfused reference: use .amp(False).fuse(False) on cpu, "
                              "or .device('cuda')")
        self.optimizer_config.validate()
        self.scheduler_config.validate()
        return self

    # ---- compiling and running ------------------------------------------------------------------------------
    def _variants(self) -> dict[str, tuple]:
        h, w, c = self.train_set.sample_shape
        n, batch = replica_samples(self.distributed_config, len(self.train_set), self.batch, self.drop_last_batch)
        variants = {"train": (min(batch, n), h, w, c)}
        if not self.drop_last_batch and n > batch and n % batch:
            variants["train_last"] = (n % batch, h, w, c)
        eval_batch = self.eval_batch or self.batch
        variants["eval"] = (eval_batch, h, w, c)
        if self.val_set is not None and len(self.val_set) % eval_batch and len(self.val_set) > eval_batch:
            variants["eval_last"] = (len(self.val_set) % eval_batch, h, w, c)
        elif self.val_set is not None and len(self.val_set) < eval_batch:
            variants["eval_last"] = (len(self.val_set), h, w, c)
        return variants

    def _compile(self):
        from planner import ArchPlan
        from planner.compiler import Compiler

        self.validate()
        h, w, c = self.train_set.sample_shape
        arch = ArchPlan.from_blueprint(self.blueprint_value, in_channels=c, fuse=self.use_fuse, amp=self.use_amp)
        plan = Compiler(arch).compile(self._variants(), training=True,
                                      optimizer_state_slots=self.optimizer_config.state_slots)
        classes = plan.value_shapes["train"][arch.output_value][1]
        labels_seen = max(self.train_set.num_classes, self.val_set.num_classes if self.val_set is not None else 0)
        if labels_seen > classes:
            raise ConfigError(f"the data has {labels_seen} classes but the model outputs {classes} logits; "
                              f"build the model with num_classes={labels_seen}")
        return plan

    def _executor(self, plan):
        if self.device_name == "cuda":
            try:
                from cuda_kernels import CudaExecutor  # raises a clear error where no GPU (or simulator) is present
            except ImportError as error:
                raise ConfigError(f"device('cuda') needs numba-cuda: pip install 'blueprint-nn[cuda]' ({error})") from error
            place_replica(self.distributed_config)   # a replica's own GPU (LOCAL_RANK), before the arena exists
            executor = CudaExecutor(plan, self.loss_config, self.optimizer_config, seed=self.seed_value)
        else:
            from cpu_ref import CpuExecutor
            executor = CpuExecutor(plan, self.loss_config, self.optimizer_config, seed=self.seed_value)
        return executor if self.distributed_config is None else replicate(executor, self.distributed_config)

    def _loaders(self):
        if self.normalisation == "auto":
            mean, std = self.train_set.channel_stats()
            if min(std) <= 0:
                channel = std.index(min(std))
                raise ConfigError(f"channel {channel} of the training data is constant (every value {mean[channel]:g}), "
                                  f"so normalize='auto' would divide by its std 0; pass .data(normalize=(mean, std)) "
                                  f"with std 1 for that channel, or normalize=None, or drop the channel")
        elif self.normalisation is None:
            mean = std = None
        else:
            mean, std = self.normalisation
        train = DataLoader(self.train_set, self.batch, shuffle=True, seed=self.seed_value,
                           drop_last=self.drop_last_batch, mean=mean, std=std, augment=self.augmentation)
        val = None
        if self.val_set is not None:
            val = DataLoader(self.val_set, self.eval_batch or self.batch, shuffle=False, seed=self.seed_value,
                             mean=mean, std=std)
        if self.distributed_config is not None:
            train, val = replica_loaders(self.distributed_config, train, val)
        return train, val, (mean, std)

    def session(self) -> _Session:
        """The compiled plan and executor (made on first use)."""
        if not self._session:
            self._session.append(self._new_session())
        return self._session[0]

    def _new_session(self) -> _Session:
        plan = self._compile()
        return _Session(plan, self._executor(plan), self.eval_batch or self.batch)

    def fit(self, epochs: int | None = None) -> list[EpochRecord]:
        """Train for the configured epochs (continuing after a `resume`); returns the history.
        `fit(epochs=n)` is `self.epochs(n).fit()`: n is the total, so a task that has done 2 epochs
        trains 3 more with `fit(epochs=5)` (the schedule spans n epochs).

        With `.progress(True)` (the default) each epoch ends with one line on stderr: epoch, time,
        train loss and accuracy, validation loss and accuracy, images/s and the learning rate; a
        terminal also shows a bar redrawn per batch, and the first numba compilation on a machine
        prints a notice (its time is kept out of images/s).

        Ctrl-C stops at the next step boundary; with `.checkpoint(path)` set, the exact position is
        saved to `path`'s interrupt file (`checkpoint.interrupted.safetensors` next to
        `checkpoint.safetensors`, which keeps the last finished epoch), and `resume` of that file
        continues with the next batch, bit-identical on the CPU to a run that never stopped."""
        if epochs is not None:
            self.session()     # made here first, so the trained weights stay with this task value too
            return self.epochs(epochs).fit()
        session = self.session()
        with DeferredInterrupt() as interrupt:
            try:
                return self._fit(session, interrupt)
            except KeyboardInterrupt:
                if self.checkpoint_path and self._writes and not interrupt.stepping and session.holds_training:
                    self.save(interrupt_path(Path(self.checkpoint_path)))
                raise

    def _fit(self, session, interrupt: DeferredInterrupt) -> list[EpochRecord]:
        with Console(self.show_progress and self._writes) as console, stop_replicas_on_error(self.distributed_config):
            return self._fit_epochs(session, interrupt, console)

    def _fit_epochs(self, session, interrupt: DeferredInterrupt, console: Console) -> list[EpochRecord]:
        loader, val_loader, _ = self._loaders()
        steps = loader.steps_per_epoch
        for epoch in range(session.epochs_done, self.epoch_count):
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
            record = EpochRecord(epoch + 1, float(position.lr), loss_sum / seen, correct / seen,
                                 val["loss"] if val else None, val["top1"] if val else None,
                                 val.get("top5") if val else None, time.perf_counter() - start, seen / train_seconds)
            session.history.append(record)
            console.epoch_done(record, self.epoch_count, steps, console.epoch_compile_seconds())
            session.epochs_done, session.position = epoch + 1, None
            if not self._writes:   # rank 0 alone writes the log and checkpoints and runs the callbacks
                continue
            if self.log_path:
                with open(self.log_path, "a", encoding="utf-8") as log:
                    log.write(json.dumps(record.as_dict()) + "\n")
            if self.checkpoint_path:
                self.save(self.checkpoint_path)
                interrupt_path(Path(self.checkpoint_path)).unlink(missing_ok=True)   # superseded
            for fn in self.callbacks:
                fn(record)
            interrupt.check()
        return list(session.history)

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
                lr = self.scheduler_config.lr_at(epoch, step, steps, self.base_lr, self.epoch_count)
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

    def evaluate(self, dataset: ArrayDataset) -> dict:
        """Loss, top-1 and (with >= 5 classes) top-5 accuracy on a dataset, in eval mode."""
        session = self.session()
        _, _, (mean, std) = self._loaders()
        if dataset.sample_shape != self.train_set.sample_shape:
            raise ConfigError(f"evaluate(): the model was compiled for samples {self.train_set.sample_shape}, "
                              f"got {dataset.sample_shape}")
        loader = DataLoader(dataset, session.eval_batch, shuffle=False, seed=0, mean=mean, std=std)
        if self.distributed_config is not None:   # each rank its share; the metrics are summed over the ranks
            loader = replica_loaders(self.distributed_config, None, loader)[1]
        return self._evaluate_loader(session, loader)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Logits for already-normalised float32 NHWC inputs (normalise as the loader does)."""
        session = self.session()
        x = np.asarray(x)
        if x.dtype != np.float32 or x.ndim != 4 or x.shape[1:] != self.train_set.sample_shape:
            raise ConfigError(f"predict(x): expected float32 (N, {', '.join(map(str, self.train_set.sample_shape))}), "
                              f"got {x.dtype} {x.shape}")
        return self._forward_padded(session, x)

    # ---- checkpoints --------------------------------------------------------------------------------------
    def save(self, path) -> Path:
        """Write weights, BN statistics, optimizer state and position as one safetensors file (atomically).
        Mid-epoch (after an interrupt) the position records the next batch and the epoch's sums so far."""
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
        path = Path(path)
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

    def resume(self, path) -> "DeepLearningTask":
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
        position = Position.from_state(path, state.get("position"), epochs_done,
                                       self._loaders()[0].steps_per_epoch)
        if position is not None and self.distributed_config is not None:
            position = resumed_position(self.distributed_config, position)
        # everything checked: only now change the session
        session.executor.load_state_dict(weights)
        session.executor.load_optimizer_state(optimizer_state)
        session.epochs_done, session.history, session.position, session.resumed = epochs_done, history, position, True
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

    @staticmethod
    def load(path) -> "DeepLearningTask":
        """A task rebuilt from a checkpoint (model, loss, optimizer, scheduler, epochs, seed, batch size);
        attach data with `.data(...)`, then `.resume(path)` to restore the weights."""
        _, state = load_checkpoint(path)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ConfigError(f"{path}: not a DeepLearningTask checkpoint (format {state.get('format')!r})")
        # parsed, never evaluated: a checkpoint cannot run code
        return (DeepLearningTask().model(parse_as(state.get("blueprint"), f"{path}: model", (BluePrint,)))
                .loss(parse_as(state.get("loss"), f"{path}: loss", (CrossEntropyLoss,)))
                .optimizer(parse_as(state.get("optimizer"), f"{path}: optimizer", (SGD, Adam, AdamW)))
                .scheduler(parse_as(state.get("scheduler"), f"{path}: scheduler",
                                    (ConstantLR, StepLR, MultiStepLR, CosineAnnealingLR)))
                .epochs(_count(path, state, "epochs", 1)).seed(_count(path, state, "seed", 0))
                ._new(batch=_count(path, state, "batch_size", 1)))


# PyTorch/Keras-style keywords: DeepLearningTask(model=bp, optimizer=SGD(lr=0.1), epochs=3) equals the chain
TASK_KEYWORDS = ("model", "loss", "optimizer", "scheduler", "epochs", "device", "amp", "fuse", "seed", "drop_last",
                 "progress", "log", "checkpoint")
keyword_construction(DeepLearningTask, TASK_KEYWORDS, " Data goes through .data(train=..., val=..., batch_size=...).")


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


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"DeepLearningTask.{name}(enabled): expected True or False, got {value!r}")
    return value


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
