"""Where training stands, so that an interrupted run continues exactly where it stopped.

Every random stream of a run is a pure function of its position, so the position is all a
checkpoint needs besides the tensors:

- the data order of epoch ``e`` and the augmentation draws of its batch ``b`` come from
  ``(seed, e)`` and ``(seed, e, b)`` (see `blueprint.task.data._loader`);
- dropout masks come from ``(seed, layer position, step count)``; the step count is the
  optimizer state's ``step``; the CUDA path's loss scale and its counters are stored with
  the optimizer state (``amp.*``);
- the position itself: the epoch in progress, the next batch to run, and the epoch's
  running sums (samples seen, correct, summed loss, last learning rate), so that the epoch's
  record comes out as if the run had never stopped.

Ctrl-C is deferred to a step boundary (`DeferredInterrupt`): the first one lets the current
step finish and stops there, so weights, optimizer state and position always agree; a second
one stops at once, and if that is inside a step (`stepping`) no interrupt checkpoint is
written (weights and position would disagree).
"""
from __future__ import annotations

import signal
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from blueprint._errors import ConfigError

INTERRUPT_SUFFIX = ".interrupted"   # checkpoint.safetensors -> checkpoint.interrupted.safetensors
PREVIEW = 80                        # characters of a long value shown in a resume error


@dataclass(frozen=True)
class Position:
    """The epoch in progress (0-based), the next batch to run and the epoch's sums so far."""

    epoch: int
    batch: int = 0
    seen: int = 0
    correct: int = 0
    loss_sum: float = 0.0
    lr: float = 0.0

    def after_step(self, samples: int, loss: float, correct: int, lr: float) -> "Position":
        return Position(self.epoch, self.batch + 1, self.seen + samples, self.correct + correct,
                        self.loss_sum + loss * samples, lr)

    @property
    def started(self) -> bool:
        return self.batch > 0

    def as_state(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_state(path, value, epochs_done: int, steps_per_epoch: int) -> "Position | None":
        """Validate a checkpoint's ``position`` entry (None: an epoch boundary)."""
        if value is None:
            return None
        names = [f.name for f in fields(Position)]
        if not isinstance(value, dict) or sorted(value) != sorted(names):
            raise ConfigError(f"{path}: the checkpoint's position must hold {names}, found {value!r}")
        number = (int, float)
        if any(isinstance(value[n], bool) or not isinstance(value[n], int) or value[n] < 0
               for n in ("epoch", "batch", "seen", "correct")) \
                or not all(isinstance(value[n], number) and not isinstance(value[n], bool) for n in ("loss_sum", "lr")):
            raise ConfigError(f"{path}: the checkpoint's position {value!r} is not a valid training position")
        position = Position(**value)
        if position.epoch != epochs_done or position.batch > steps_per_epoch:
            raise ConfigError(f"{path}: the checkpoint stopped at batch {position.batch} of epoch {position.epoch + 1} "
                              f"after {epochs_done} finished epochs, but this task has {steps_per_epoch} batches per "
                              "epoch; resume with the data and batch size the checkpoint was trained with")
        return position


def interrupt_path(checkpoint: Path) -> Path:
    """Where an interrupted run writes its mid-epoch checkpoint: next to the epoch checkpoint,
    never over it (``run/checkpoint.safetensors`` -> ``run/checkpoint.interrupted.safetensors``)."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.stem + INTERRUPT_SUFFIX + checkpoint.suffix)


class ResumeError(ConfigError):
    """A checkpoint that this task cannot continue from; the message names the field and the fix."""


def _preview(value) -> str:
    text = str(value)
    return text if len(text) <= PREVIEW else text[:PREVIEW] + "..."


def check_resumable(path, recorded: dict, current: dict, fixes: dict) -> None:
    """Refuse to resume when a field the checkpoint depends on differs: one line naming the field,
    the checkpoint's value, this task's value and the fix. ``recorded``/``current``: field -> value."""
    for name, theirs in recorded.items():
        ours = current[name]
        if theirs != ours:
            raise ResumeError(f"{path}: cannot resume: different {name}: the checkpoint has {_preview(theirs)}, this "
                              f"task has {_preview(ours)}; {fixes[name]}")


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is (the position saved, the run folder's lock released); the CLI exits 143."""


#: The signals deferred to a step boundary, each with its default handler (only a default one is replaced).
DEFERRED_SIGNALS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


class DeferredInterrupt:
    """Within ``with``: Ctrl-C (or SIGTERM) sets a flag that `check()` turns into KeyboardInterrupt
    (`Terminated` for SIGTERM) at the next step boundary; a second one raises at once. Outside the main
    thread it changes nothing."""

    def __init__(self):
        self.requested = False
        self.stepping = False     # set by the training loop while a step is under way
        self._previous = {}
        self._raise = KeyboardInterrupt

    def __enter__(self) -> "DeferredInterrupt":
        if threading.current_thread() is threading.main_thread():
            for signum, default in DEFERRED_SIGNALS.items():
                if signal.getsignal(signum) is default:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame):
        self._raise = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        if self.requested:
            raise self._raise
        self.requested = True

    def check(self) -> None:
        if self.requested:
            raise self._raise

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
