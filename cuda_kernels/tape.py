"""Launch tapes: a training step recorded once as a list of kernel launches.

Launchers (``activation_forward(launcher, ...)`` and friends) never launch directly:
they call ``launcher.launch(spec, grid, block, *args)``. Two launchers exist:

- ``LaunchTape`` records the launch (after checking the argument types against the
  kernel table) and replays the whole list later: eagerly with ``replay(stream)`` or as
  one CUDA graph (``cuda_kernels.graph``). Everything a kernel reads per step must
  therefore live in device memory: the recorded arguments are frozen.
- ``Immediate`` checks the arguments the same way and launches at once (tests, debugging).

A tape may also hold the step's host <-> device transfers and events (``cuda_kernels.transfer``:
entries with ``kind`` "upload", "download" or "event"), before its first and after its last
kernel. ``segments()`` splits it there: graph replay captures the kernels only and issues the
transfers around the graph launch, on the same stream. A data-parallel step also holds
``collective`` entries (``cuda_kernels.collective``) among its kernels; they are captured with them.
"""
from dataclasses import dataclass

from .dynamic_smem import raise_shared_limit
from .registry import check_args
from .traffic import device_span  # noqa: F401 - where the tests and the benchmarks import it

#: Entries graph capture records: kernels, and the data-parallel all-reduces (``collective``), which
#: run on the step's stream like a kernel.
CAPTURED_KINDS = ("kernel", "collective")


@dataclass(frozen=True)
class Launch:
    spec: object
    grid: tuple
    block: tuple
    args: tuple
    kind = "kernel"

    @property
    def name(self):
        return self.spec.name

    def run(self, stream):
        """Launch on ``stream``; a kernel above 48 KB of dynamic shared memory must have had its limit raised
        (``LaunchTape.compile_kernels``, ``Immediate``): nothing is looked up here, on the hot path."""
        self.spec.kernel[self.grid, self.block, stream, self.spec.dynamic_shared_bytes](*self.args)


class LaunchTape:
    """An ordered list of kernel launches with device-array arguments only (and, around them,
    the step's transfers)."""

    def __init__(self):
        self._entries = []
        self._prepared = False   # every kernel compiled and its shared-memory limit raised

    def launch(self, spec, grid, block, *args):
        check_args(spec, args)
        self._entries.append(Launch(spec, grid, block, args))
        self._prepared = False

    def add(self, entry):
        """Append a transfer or event entry (anything with ``kind``, ``name`` and ``run(stream)``)."""
        if entry.kind == "kernel":
            raise TypeError("LaunchTape.add: kernels are recorded with launch(), which checks their arguments")
        self._entries.append(entry)

    def coalesce_zero_fills(self, base):
        """Merge the recorded zero-fills of the arena ``base`` (uint8) into few multi-range launches, each as
        early as the launches before it allow (``zero_ranges.coalesce_zero_fills``)."""
        from .zero_ranges import coalesce_zero_fills
        self._entries = coalesce_zero_fills(self._entries, base, Launch)
        self._prepared = False

    def compile_kernels(self):
        """Compile every kernel on the tape for its signature, each once (see ``KernelSpec.compile``), and
        raise the dynamic shared memory limit of those above 48 KB on the current device (``dynamic_smem``):
        ``StepRunner`` calls this before the first replay, so before any graph capture."""
        seen = set()
        for entry in self._entries:
            if entry.kind == "kernel" and entry.spec.name not in seen:
                seen.add(entry.spec.name)
                entry.spec.compile()
                raise_shared_limit(entry.spec)
        self._prepared = True

    def replay(self, stream=0):
        """Run every entry, in order, on ``stream`` (no host synchronisation); the first replay of a tape
        nobody prepared compiles its kernels and raises their limits first (``compile_kernels``)."""
        if not self._prepared:
            self.compile_kernels()
        for entry in self._entries:
            entry.run(stream)

    def segments(self):
        """``(before, kernels, after)``: the transfers before the first kernel, the kernels, the transfers
        after the last one. A transfer between two kernels is refused (graph capture takes kernels only)."""
        where = [i for i, e in enumerate(self._entries) if e.kind in CAPTURED_KINDS]
        if not where:
            return list(self._entries), [], []
        first, last = where[0], where[-1]
        body = self._entries[first:last + 1]
        stray = [e.name for e in body if e.kind not in CAPTURED_KINDS]
        if stray:
            raise ValueError(f"LaunchTape: transfers {stray} sit between kernels; record uploads before the first "
                             f"kernel and downloads after the last one")
        return self._entries[:first], body, self._entries[last + 1:]

    def kernels(self):
        return [e for e in self._entries if e.kind == "kernel"]

    def kernel_specs(self):
        """The distinct kernels of the tape, in first-use order."""
        return list({id(e.spec): e.spec for e in self.kernels()}.values())

    def names(self):
        """The kernel names, in launch order."""
        return [e.spec.name for e in self.kernels()]

    def entries(self):
        """``(kind, name)`` of every entry, in stream order."""
        return [(e.kind, e.name) for e in self._entries]

    def __len__(self):
        """The number of kernel launches."""
        return len(self.kernels())

    def __iter__(self):
        return iter(self._entries)


class Immediate:
    """A launcher that runs each launch at once on ``stream``."""

    def __init__(self, stream=0):
        self.stream = stream

    def launch(self, spec, grid, block, *args):
        check_args(spec, args)
        raise_shared_limit(spec)   # once per compiled kernel (``dynamic_smem``); nothing below 48 KB
        Launch(spec, grid, block, args).run(self.stream)

