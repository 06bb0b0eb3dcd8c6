"""`DeepLearningTask`: the chained training API.

Configuration is an immutable value: every setter returns a new task. `fit()` compiles the
variants it needs once (train, the last partial train batch unless `drop_last`, eval, the
last partial eval batch), creates the executor for `.device()`, and trains; the trained
session stays attached to that task value for `evaluate()`, `predict()` and `save()`.
"""
from __future__ import annotations

import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from blueprint._errors import ConfigError
from blueprint._layer import BluePrint
from blueprint.optim import SCHEDULES, SGD, Adam, AdamW, ConstantLR, CrossEntropyLoss, keyword_construction
from blueprint.task._callbacks import TRACKED_CALLBACKS, Tracked, check_tracked
from blueprint.task._checkpoint import checkpoint_lock
from blueprint.task._fit_loop import DivergedError, EpochRecord, FitLoop, classification_metrics
from blueprint.task._replica_task import (check_replica_batch, place_replica, replica_loaders, replica_samples,
                                          replicate)
from blueprint.task._position import DeferredInterrupt, Position, interrupt_path
from blueprint.task._save_resume import CHECKPOINT_FORMAT, SaveResume
from blueprint.task.data import ArrayDataset, Augment, DataLoader, validation_split

if TYPE_CHECKING:
    from blueprint._model import Model

__all__ = ["CHECKPOINT_FORMAT", "ConfigError", "DeepLearningTask", "DivergedError", "EpochRecord", "TASK_KEYWORDS",
           "classification_metrics"]

DEVICES = ("cpu", "cuda")
UNCHANGED = object()   # a setter argument that was not passed: the value stays as it was


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
    tracked: Tracked = field(default_factory=Tracked)   # callbacks' and a plateau schedule's state; why it stopped

    @property
    def holds_training(self) -> bool:
        """True once the weights are worth keeping: trained, or loaded from a checkpoint."""
        return self.resumed or self.executor.step_count > 0


@dataclass(frozen=True)
class DeepLearningTask(FitLoop, SaveResume):
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
        """The loss (default `CrossEntropyLoss()`; e.g. ``CrossEntropyLoss(label_smoothing=0.1)``)."""
        if not isinstance(loss, CrossEntropyLoss):
            raise TypeError(f"DeepLearningTask.loss(loss): expected CrossEntropyLoss(), got {type(loss).__name__}")
        return self._new(loss_config=loss)

    def optimizer(self, opt) -> "DeepLearningTask":
        """The optimizer: `SGD`, `Adam` or `AdamW` (default ``SGD()``, lr 0.1). Its ``lr`` is the learning
        rate unless the schedule sets its own ``base_lr`` (see `scheduler`)."""
        if not isinstance(opt, (SGD, Adam, AdamW)):
            raise TypeError(f"DeepLearningTask.optimizer(opt): expected SGD(), Adam() or AdamW(), got {type(opt).__name__}")
        return self._new(optimizer_config=opt.validate())

    def scheduler(self, schedule) -> "DeepLearningTask":
        """The learning-rate schedule (default `ConstantLR()`). Its ``base_lr``, when set, is the lr the
        schedule starts from and the optimizer's ``lr`` is then not used (a warning says so when both
        are set); without it the schedule scales the optimizer's ``lr``."""
        if not isinstance(schedule, SCHEDULES):
            names = ", ".join(s.__name__ + "()" for s in SCHEDULES)
            raise TypeError(f"DeepLearningTask.scheduler(s): expected one of {names}, got {type(schedule).__name__}")
        return self._new(scheduler_config=schedule.validate())

    def data(self, train=UNCHANGED, val=UNCHANGED, batch_size=UNCHANGED, eval_batch_size=UNCHANGED,
             augment=UNCHANGED, normalize=UNCHANGED, val_fraction: float | None = None) -> "DeepLearningTask":
        """Set what the call names, leave the rest as it was: ``train``/``val`` (`ArrayDataset`s; ``val=None``
        removes the validation set), ``batch_size`` (default 128), ``eval_batch_size`` (None: the batch
        size), ``augment`` (an `Augment` or None), ``normalize`` ("auto": the train set's channel
        statistics, None, or a (mean, std) pair). ``val_fraction`` holds out that share of ``train``
        (stratified, `validation_split`) as the validation set.

        >>> task = DeepLearningTask().data(train=train, val=val).data(batch_size=32)   # doctest: +SKIP
        >>> task.val_set is val                                                         # doctest: +SKIP
        True
        """
        train = self.train_set if train is UNCHANGED else train
        val = self.val_set if val is UNCHANGED else val
        batch_size = None if batch_size is UNCHANGED else batch_size
        eval_batch_size = self.eval_batch if eval_batch_size is UNCHANGED else eval_batch_size
        augment = self.augmentation if augment is UNCHANGED else augment
        normalize = self.normalisation if normalize is UNCHANGED else normalize
        for name, value in (("train", train), ("val", val)):
            if value is not None and not isinstance(value, ArrayDataset):
                raise TypeError(f"DeepLearningTask.data({name}=...): expected an ArrayDataset, got "
                                f"{type(value).__name__}; wrap images (N, H, W, C) and labels (N,) as "
                                f"ArrayDataset(x, y) (from blueprint.task.data)")
        for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ConfigError(f"DeepLearningTask.data({name}=...): expected a positive int, got {value!r}")
        if val_fraction is not None:
            if train is None or val is not None:
                raise ConfigError("DeepLearningTask.data(val_fraction=...) splits the training set into train and "
                                  "val: pass train=... and no val (or val=None)")
            train, val = validation_split(train, val_fraction)
        if not (normalize is None or (isinstance(normalize, str) and normalize == "auto")
                or (isinstance(normalize, tuple) and len(normalize) == 2)):
            raise ConfigError(f"DeepLearningTask.data(normalize=...): expected 'auto' (the train set's channel "
                              f"statistics), None (no normalisation) or a (mean, std) pair, got {normalize!r}")
        return self._new(train_set=train, val_set=val, batch=batch_size or self.batch,
                         eval_batch=eval_batch_size, augmentation=augment, normalisation=normalize)

    def epochs(self, n: int) -> "DeepLearningTask":
        """The total number of epochs (default 1); a schedule spans them all."""
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
        """fp16 activations with fp32 master weights (default: on for cuda, off for cpu; cpu needs off)."""
        return self._new(amp_enabled=_flag("amp", enabled))

    def fuse(self, enabled: bool) -> "DeepLearningTask":
        """Fused kernels (default: on for cuda, off for cpu); needs ``amp(True)``."""
        return self._new(fuse_enabled=_flag("fuse", enabled))

    def seed(self, value: int) -> "DeepLearningTask":
        """Seeds the initial weights, the data order, augmentation and dropout (default 0)."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"DeepLearningTask.seed(value): expected an int >= 0, got {value!r}")
        return self._new(seed_value=value)

    def drop_last(self, enabled: bool = True) -> "DeepLearningTask":
        """Drop the last partial training batch of each epoch (default False: train on it)."""
        return self._new(drop_last_batch=_flag("drop_last", enabled))

    def progress(self, enabled: bool) -> "DeepLearningTask":
        """Print the per-epoch line (and a bar on a terminal) to stderr (default True)."""
        return self._new(show_progress=_flag("progress", enabled))

    def callback(self, fn: Callable[[EpochRecord], None]) -> "DeepLearningTask":
        """Add a function called with each epoch's `EpochRecord` after it ends, or a tracked callback
        (`EarlyStopping`, `ModelCheckpoint`: their state is saved and resumed with the checkpoints). A
        function may raise `StopTraining` (or `StopIteration`) to end `fit()` after that epoch."""
        if not callable(fn) and not isinstance(fn, TRACKED_CALLBACKS):
            raise TypeError(f"DeepLearningTask.callback(fn): expected a callable, EarlyStopping(...) or "
                            f"ModelCheckpoint(...), got {fn!r}")
        return self._new(callbacks=self.callbacks + (fn,))

    def log(self, path) -> "DeepLearningTask":
        """Append one JSON line per epoch to `path`."""
        return self._new(log_path=None if path is None else str(path))

    def checkpoint(self, path) -> "DeepLearningTask":
        """Save a checkpoint to `path` after every epoch, and when training is interrupted (Ctrl-C). `fit()`
        creates its folder and holds the checkpoint's lock for the whole run: another process training into
        the same path is refused."""
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
    def stopped(self) -> str | None:
        """Why a callback ended training early (None: it ran, or runs, every epoch)."""
        return self._session[0].tracked.stopped if self._session else None

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
        check_tracked(self)
        self._warn_about_two_learning_rates()
        return self

    def _warn_about_two_learning_rates(self) -> None:
        """The rule: a schedule's own ``base_lr`` wins over the optimizer's ``lr``. Say so when the
        optimizer's lr was set (differs from its default) to another value, which would go unused."""
        own, optimizer = self.scheduler_config.base_learning_rate, self.optimizer_config
        if own is not None and optimizer.learning_rate not in (own, type(optimizer)().learning_rate):
            warnings.warn(f"the schedule's base_lr {own:g} overrides the optimizer's lr {optimizer.learning_rate:g}, "
                          f"which is not used ({self.scheduler_config!r} with {optimizer!r}); set the learning rate in "
                          "one place", UserWarning, stacklevel=4)

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
                              f"end the model with fc({labels_seen}) (a zoo model: build it with "
                              f"num_classes={labels_seen})")
        return plan

    def _executor(self, plan):
        if self.device_name == "cuda":
            try:
                from cuda_kernels import CudaExecutor  # raises a clear error where no GPU (or simulator) is present
            except ImportError as error:
                fix = "" if '".[cuda]"' in str(error) else ": pip install \".[cuda]\" in the blueprint-nn source tree"
                raise ConfigError(f"device('cuda') needs numba-cuda{fix} ({error})") from error
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
            check_same_dtype(self.train_set, self.val_set, "DeepLearningTask.data(val=...)")
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
        with DeferredInterrupt() as interrupt, self._run_lock():
            try:
                return self._fit(session, interrupt)
            except KeyboardInterrupt:
                if self.checkpoint_path and self._writes and not interrupt.stepping and session.holds_training:
                    self.save(interrupt_path(Path(self.checkpoint_path)))
                raise

    def _run_lock(self):
        """The checkpoint's lock for the whole run (rank 0 alone writes): a second process training into the
        same checkpoint is refused at its start, not after it overwrote this run's epochs. The checkpoint's
        folder is created here (as the CLI creates --out), so a missing one is not found after an epoch."""
        if not (self.checkpoint_path and self._writes):
            return nullcontext()
        Path(self.checkpoint_path).parent.mkdir(parents=True, exist_ok=True)
        return checkpoint_lock(self.checkpoint_path)

    def evaluate(self, dataset: ArrayDataset) -> dict:
        """Loss, top-1 and (with >= 5 classes) top-5 accuracy on a dataset, in eval mode."""
        session = self.session()
        _, _, (mean, std) = self._loaders()
        if dataset.sample_shape != self.train_set.sample_shape:
            raise ConfigError(f"evaluate(): the model was compiled for samples {self.train_set.sample_shape}, "
                              f"got {dataset.sample_shape}")
        check_same_dtype(self.train_set, dataset, "evaluate(dataset)")
        check_labels(dataset, session.executor.classes, "evaluate(dataset)")
        loader = DataLoader(dataset, session.eval_batch, shuffle=False, seed=0, mean=mean, std=std)
        if self.distributed_config is not None:   # each rank its share; the metrics are summed over the ranks
            loader = replica_loaders(self.distributed_config, None, loader)[1]
        return self._evaluate_loader(session, loader)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """float32 logits (N, classes) of raw data as in the training set (NHWC, its dtype: uint8 images
        as they are), normalised as the loader normalised the training batches; what `Model.logits`
        takes and returns, run on this task's device."""
        session = self.session()
        if self.train_set is None:
            raise ConfigError("logits(x) needs the task's training data (its input normalisation): "
                              "call .data(train=...)")
        return self._forward_padded(session, self._input_spec().normalise(x, "DeepLearningTask.logits(x)"))

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        """Softmax of `logits(x)`, float32 (N, classes)."""
        z = self.logits(x).astype(np.float64)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return (z / z.sum(axis=1, keepdims=True)).astype(np.float32)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The predicted class (int64, N) of raw data as in the training set: `Model.predict`'s contract
        (``task.model().predict(x)`` gives the same classes on the CPU). Logits and probabilities:
        `logits(x)`, `probabilities(x)`.

        >>> task.predict(val.x[:4])                 # doctest: +SKIP
        array([3, 7, 7, 0])
        """
        return self.logits(x).argmax(axis=1).astype(np.int64)

# PyTorch/Keras-style keywords: DeepLearningTask(model=bp, optimizer=SGD(lr=0.1), epochs=3) equals the chain
TASK_KEYWORDS = ("model", "loss", "optimizer", "scheduler", "epochs", "device", "amp", "fuse", "seed", "drop_last",
                 "progress", "log", "checkpoint")
keyword_construction(DeepLearningTask, TASK_KEYWORDS, " Data goes through .data(train=..., val=..., batch_size=...).")


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"DeepLearningTask.{name}(enabled): expected True or False, got {value!r}")
    return value


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def check_same_dtype(train, other, where: str) -> None:
    """uint8 images are divided by 255 before normalisation, anything else by 1: a float copy of uint8
    training images would be off by 255 without notice (`Model.logits` refuses it the same way)."""
    if (train.x.dtype == np.uint8) != (other.x.dtype == np.uint8):
        raise ConfigError(f"{where}: the training data is {train.x.dtype} but this set is {other.x.dtype}; uint8 "
                          "images are divided by 255 before normalising and other data by 1, so one of the two "
                          f"would be off by 255; pass this set as {train.x.dtype}, in the training set's units")


def check_labels(dataset, classes: int, where: str) -> None:
    labels = np.asarray(dataset.y)
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ConfigError(f"{where}: labels must be in [0, {classes}) for this {classes}-class model, got values in "
                          f"[{labels.min()}, {labels.max()}]; pass labels of the classes the model was trained on")
