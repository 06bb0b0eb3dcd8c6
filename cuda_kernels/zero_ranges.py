"""Zeroing of many arena ranges in one launch, and the tape pass that merges a step's zero-fills into it.

A recorded step zeroes each accumulator (BN sums, weight and BN gradients, the loss, the overflow flag)
right before the kernel that accumulates into it: ~270 one-range ``fill_zero`` launches in a ResNet-50
step. ``coalesce_zero_fills`` moves each such fill back to just after the last earlier launch that
touches its bytes (a kernel with an argument overlapping it, or any non-kernel entry: transfers and
collectives are barriers), so a fill never passes the last use of its region by another tensor that the
planner placed there, and merges the fills that meet into one ``fill_zero_ranges`` launch (up to
``MAX_RANGES`` ranges each): one launch per group of fills that nothing separates.
"""
import numpy as np
from numba import cuda

from .registry import W1, check_args, grid_1d, kernel, nbt
from .traffic import BYTE_RULES, device_span

MAX_RANGES = 32
RANGES = nbt.UniTuple(nbt.int64, MAX_RANGES)
FILLS = ("fill_zero_u32", "fill_zero_u32_vec4", "fill_zero_f16")   # every kernel fill_zero launches


@kernel("fill_zero_ranges", (W1, RANGES, RANGES))
def _fill_zero_ranges(words, starts, counts):
    """Zero ``words[starts[r]:starts[r] + counts[r]]`` for range ``r = blockIdx.y``."""
    r = cuda.blockIdx.y
    start, count = starts[r], counts[r]
    for i in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, count, cuda.gridDim.x * cuda.blockDim.x):
        words[start + i] = 0


BYTE_RULES["fill_zero_ranges"] = lambda args: (0, 4 * int(sum(args[2])))   # the words of its ranges


def fill_zero_ranges(launcher, words, ranges):
    """Zero ``ranges`` (``(first word, words)`` pairs, at most ``MAX_RANGES``) of the uint32 array ``words``."""
    if not 0 < len(ranges) <= MAX_RANGES:
        raise ValueError(f"fill_zero_ranges: expects 1 to {MAX_RANGES} ranges, got {len(ranges)}")
    pad = [(0, 0)] * (MAX_RANGES - len(ranges))
    starts = tuple(np.int64(s) for s, _ in list(ranges) + pad)
    counts = tuple(np.int64(n) for _, n in list(ranges) + pad)
    blocks, threads = grid_1d(max(n for _, n in ranges))
    launcher.launch(_fill_zero_ranges, (blocks, len(ranges)), threads, words, starts, counts)


_span = device_span


def _spans(entry):
    """The byte spans ``entry`` may read or write: its array arguments' if a kernel; None (everything) else."""
    if entry.kind != "kernel":
        return None
    return [_span(arg) for arg in entry.args if hasattr(arg, "nbytes") and getattr(arg, "ndim", 0) >= 1
            and arg.nbytes]


def _touches(spans, start, end):
    """Whether an entry with ``spans`` (``_spans``) may touch bytes ``[start, end)``."""
    return spans is None or any(a < end and start < b for a, b in spans)


def _fill_range(entry, base_start, base_end):
    """``(start byte, end byte)`` of a one-range fill of the arena, or None (not a fill, outside the arena,
    not whole 4-byte words)."""
    if entry.kind != "kernel" or entry.spec.name not in FILLS:
        return None
    start, end = _span(entry.args[0])
    if start < base_start or end > base_end or (start - base_start) % 4 or (end - start) % 4 or end == start:
        return None
    return start, end


def coalesce_zero_fills(entries, base, make_launch):
    """``entries`` (a tape's, in stream order) with the fills of the uint8 arena ``base`` merged: see the
    module docstring. ``make_launch(spec, grid, block, args)`` builds a tape entry."""
    base_start, base_end = _span(base)
    out, spans = [], []   # entries and lists of (start, end) ranges (the merged fills); the entries' spans
    for entry in entries:
        span = _fill_range(entry, base_start, base_end)
        if span is None:
            out.append(entry)
            spans.append(_spans(entry))
            continue
        target, i = None, len(out)
        while i > 0 and (isinstance(out[i - 1], list) or not _touches(spans[i - 1], *span)):
            i -= 1
            if isinstance(out[i], list):
                target = out[i]   # the earliest group reachable
        if target is None:
            out.insert(i, [span])
            spans.insert(i, [])
        else:
            target.append(span)
    class _Collect:
        def __init__(self):
            self.launches = []

        def launch(self, spec, grid, block, *args):
            check_args(spec, args, host_stand_ins=isinstance(base, np.ndarray))
            self.launches.append(make_launch(spec, grid, block, args))
    result = []
    for item in out:
        if not isinstance(item, list):
            result.append(item)
            continue
        collect = _Collect()
        for k in range(0, len(item), MAX_RANGES):
            chunk = item[k:k + MAX_RANGES]
            lo, hi = min(s for s, _ in chunk), max(e for _, e in chunk)   # the launch's view: these bytes only
            words = base[lo - base_start:hi - base_start].view(np.uint32)
            fill_zero_ranges(collect, words, [((s - lo) // 4, (e - s) // 4) for s, e in chunk])
        result.extend(collect.launches)
    return result
