"""The arena is checked against the memory available before it is allocated.

A plan's arena (`plan.memory.arena_bytes`) is one allocation; an executor asks `check_arena_fits`
first, with the host's available memory (CPU path: `/proc/meminfo`'s MemAvailable, else
`os.sysconf`) or the device's free memory (CUDA path), and an arena that does not fit is refused
with its size, the amount available and the largest batch that would fit (the batch-dependent
regions scale with the batch; parameters, gradients and optimizer state do not).
"""
from __future__ import annotations

import os

from planner.memory import human_bytes

BATCH_INDEPENDENT = ("params", "weights16", "grads", "optim", "bn_stats", "scalars")


class ArenaTooLargeError(ValueError):
    """The plan's arena is larger than the memory available to allocate it."""


def host_available_bytes() -> int | None:
    """Memory the host can give without swapping (MemAvailable), or None where it cannot be told."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_arena_fits(plan, available: int | None, where: str) -> None:
    """Refuse `plan`'s arena if it is larger than `available` bytes (None: unknown, not checked)."""
    need = plan.memory.arena_bytes
    if available is None or need <= available:
        return
    fixed = sum(plan.memory.regions.get(name, (0, 0))[1] for name in BATCH_INDEPENDENT)
    batch = max(v.input_shape[0] for v in plan.variants.values())
    per_sample = max(need - fixed, 1) / batch
    fits = int((available - fixed) // per_sample) if available > fixed else 0
    fix = (f"a batch of about {fits} would fit (now {batch})" if fits >= 1 else
           f"not even a batch of 1 fits: the parameters and optimizer state alone take {human_bytes(fixed)}")
    raise ArenaTooLargeError(f"the plan's arena needs {human_bytes(need)} ({need:,} bytes) but the {where} has "
                             f"{human_bytes(available)} ({available:,} bytes) available; {fix}; lower the batch size "
                             "or use a smaller model")


__all__ = ["ArenaTooLargeError", "check_arena_fits", "host_available_bytes"]
