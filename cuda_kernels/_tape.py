"""Launch tapes: a training step recorded once as a list of kernel launches.

Launchers (``activation_forward(launcher, ...)`` and friends) never launch directly:
they call ``launcher.launch(spec, grid, block, *args)``. Two launchers exist:

- ``LaunchTape`` records the launch (after checking the argument types against the
  kernel table) and replays the whole list later: eagerly with ``replay(stream)`` or as
  one CUDA graph (``cuda_kernels._graph``). Everything a kernel reads per step must
  therefore live in device memory: the recorded arguments are frozen.
- ``Immediate`` checks the arguments the same way and launches at once (tests, debugging).
"""
from dataclasses import dataclass

from ._registry import check_args


@dataclass(frozen=True)
class Launch:
    spec: object
    grid: tuple
    block: tuple
    args: tuple

    def run(self, stream):
        self.spec.kernel[self.grid, self.block, stream](*self.args)


class LaunchTape:
    """An ordered list of kernel launches with device-array arguments only."""

    def __init__(self):
        self._launches = []

    def launch(self, spec, grid, block, *args):
        check_args(spec, args)
        self._launches.append(Launch(spec, grid, block, args))

    def replay(self, stream=0):
        """Run every recorded launch, in order, on ``stream`` (no host synchronisation)."""
        for entry in self._launches:
            entry.run(stream)

    def kernel_specs(self):
        """The distinct kernels of the tape, in first-use order."""
        return list({id(e.spec): e.spec for e in self._launches}.values())

    def names(self):
        return [e.spec.name for e in self._launches]

    def __len__(self):
        return len(self._launches)

    def __iter__(self):
        return iter(self._launches)


class Immediate:
    """A launcher that runs each launch at once on ``stream``."""

    def __init__(self, stream=0):
        self.stream = stream

    def launch(self, spec, grid, block, *args):
        check_args(spec, args)
        Launch(spec, grid, block, args).run(self.stream)
