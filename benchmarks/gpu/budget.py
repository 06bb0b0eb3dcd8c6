"""The run's time budget, read from an injected clock (tests pass a fake one: no outcome depends on
how fast the machine running them is)."""
import time

DEFAULT_CLOCK = time.monotonic   # the clock of a Budget made without one (a unit's own); tests replace it


class Budget:
    """``seconds`` from ``started`` (default: now) on ``clock`` (default ``DEFAULT_CLOCK``, read when the
    budget is made)."""

    def __init__(self, seconds, started=None, clock=None):
        clock = DEFAULT_CLOCK if clock is None else clock
        self.seconds, self.clock = seconds, clock
        self.deadline = (clock() if started is None else started) + seconds

    def left(self):
        return self.deadline - self.clock()

    def allows(self, seconds, what, skipped):
        """True if ``seconds`` are left; otherwise say so and add ``what`` to ``skipped``."""
        if self.left() >= seconds:
            return True
        message = f"{what}: NOT RUN, {max(self.left(), 0):.0f} s of the {self.seconds:.0f} s budget left " \
                  f"(needs ~{seconds:.0f} s; raise --budget)"
        print(f"  {message}")
        skipped.append(message)
        return False


class FrozenClock:
    """A clock that moves only when told (``advance``): budgets in tests and dry runs."""

    def __init__(self, now=0.0):
        self.now = now

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds
