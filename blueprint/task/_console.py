"""What `fit()` prints while it trains, and the compile time it keeps out of images/s.

On a terminal each epoch shows a progress bar redrawn per batch, replaced at the end of the epoch
by one Keras-like line; anywhere else (a CI log, `2> file`) only that line is written, once per
epoch. The first numba compilation in a run prints a one-time notice, and the epoch line says how
long compiling took: numba's "numba:compile" event fires only when a kernel is really compiled (a
disk-cache miss), never when one is loaded from the cache, so on the CPU path the notice appears on
the first run on a machine and not afterwards. The CUDA kernels are not cached on disk: the CUDA
executor compiles each recorded step's kernels once per process, before the step's first replay,
inside the same event (`cuda_kernels.registry.KernelSpec.compile`), so the notice and the img/s
correction cover them too. Everything goes to stderr, so stdout keeps the result alone
(`blueprint train --json > result.json`).
"""
from __future__ import annotations

import sys
import time
from contextlib import ExitStack

COMPILE_NOTICE = "compiling kernels (CPU: first run on this machine, cached afterwards; CUDA: once per process) ..."


class CompileWatch:
    """Wall time spent inside numba compilations while active (nested compilations counted once)."""

    def __init__(self, on_first_compile=None):
        self.seconds = 0.0
        self.compiled = False
        self._depth = 0
        self._since = 0.0
        self._on_first_compile = on_first_compile
        self._stack = ExitStack()

    def __enter__(self) -> "CompileWatch":
        from numba.core import event
        self._stack.enter_context(event.install_listener("numba:compile", _compile_listener(event, self)))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def started(self) -> None:
        if self._depth == 0:
            self._since = time.perf_counter()
            if not self.compiled and self._on_first_compile is not None:
                self._on_first_compile()
            self.compiled = True
        self._depth += 1

    def ended(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.seconds += time.perf_counter() - self._since


def _compile_listener(event, watch: CompileWatch):
    class Listener(event.Listener):
        def on_start(self, event):
            watch.started()

        def on_end(self, event):
            watch.ended()
    return Listener()


class Console:
    """The progress display of one `fit()`: `None` stream means silent."""

    def __init__(self, enabled: bool, stream=None):
        self.stream = (stream or sys.stderr) if enabled else None
        self.interactive = bool(self.stream is not None and getattr(self.stream, "isatty", lambda: False)())
        self.watch = CompileWatch(self._notice)
        self._bar = None
        self._compile_before = 0.0

    def __enter__(self) -> "Console":
        self.watch.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.close_bar()
        self.watch.__exit__(*exc)

    def _write(self, line: str) -> None:
        if self.stream is None:
            return
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def _notice(self) -> None:
        self._write(COMPILE_NOTICE)

    def begin_epoch(self, total: int, done: int, description: str) -> None:
        """Start the epoch's compile count; a bar redrawn per batch, on a terminal only."""
        self._compile_before = self.watch.seconds
        if self.interactive:
            from tqdm import tqdm
            self._bar = tqdm(total=total, initial=done, desc=description, unit="batch", leave=False,
                             dynamic_ncols=True, file=self.stream)

    def epoch_compile_seconds(self) -> float:
        """Seconds spent compiling kernels since `begin_epoch`."""
        return self.watch.seconds - self._compile_before

    def batch_done(self, position, seen_before: int, start: float) -> None:
        if self._bar is not None:
            seconds = time.perf_counter() - start - self.epoch_compile_seconds()
            self._bar.update(1)
            self._bar.set_postfix(loss=f"{position.loss_sum / position.seen:.4f}",
                                  acc=f"{position.correct / position.seen:.3f}",
                                  img_s=f"{(position.seen - seen_before) / max(seconds, 1e-9):.0f}")

    def close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def say(self, line: str) -> None:
        """One line of news from training (a callback stopping it, a cut learning rate)."""
        self._write(line)

    def epoch_done(self, record, epochs: int, steps: int, compile_seconds: float) -> None:
        self._write(epoch_line(record, epochs, steps, compile_seconds))


def epoch_line(record, epochs: int, steps: int, compile_seconds: float = 0.0) -> str:
    """`epoch 3/8  45/45  2.1s  loss 0.4321  acc 0.9120  val_loss 0.2101  val_acc 0.9580  1234 img/s  lr 0.0412`."""
    parts = [f"epoch {record.epoch}/{epochs}", f"{steps}/{steps}", f"{record.seconds:.1f}s",
             f"loss {record.train_loss:.4f}", f"acc {record.train_accuracy:.4f}"]
    if record.val_loss is not None:
        parts += [f"val_loss {record.val_loss:.4f}", f"val_acc {record.val_accuracy:.4f}"]
    parts += [f"{record.images_per_second:.0f} img/s", f"lr {record.lr:.4g}"]
    if compile_seconds > 0:
        parts.append(f"(compiling kernels took {compile_seconds:.1f}s, not counted in img/s)")
    return "  ".join(parts)
