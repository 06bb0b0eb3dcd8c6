"""What makes the GPU check a one-shot protocol: the versions record (always first), the JSON Lines
record writer (one flushed record per finished unit, so a run cut off keeps everything it measured),
the per-kernel breakdown of one training step (CUDA events around each tape entry, eager replay), and
the final line a person pastes."""
import json
import os
import platform
import subprocess
import time

import numpy as np

NOT_ON_CPU = "unavailable: no CUDA GPU here"
PACKAGES = ("numpy", "numba", "numba-cuda", "cuda-core", "cuda-bindings", "cuda-pathfinder", "torch")
NVIDIA_SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
                     "power.limit")


# ---- the versions record ---------------------------------------------------------------------------------

def _package_version(name):
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _nvidia_smi():
    """``{field: value}`` from ``nvidia-smi --query-gpu`` (first GPU), or ``{"nvidia-smi": why not}``."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as error:
        return {"nvidia-smi": f"unavailable: {type(error).__name__}: {error}"}
    if out.returncode != 0:
        return {"nvidia-smi": f"unavailable: exit {out.returncode}: {(out.stderr or out.stdout).strip()[:200]}"}
    values = [v.strip() for v in out.stdout.splitlines()[0].split(",")]
    return dict(zip(NVIDIA_SMI_FIELDS, values))


def _read(getter):
    """``getter()``, or what went wrong (one unreadable field must not hide the others)."""
    try:
        return getter()
    except Exception as error:
        return f"unavailable: {type(error).__name__}: {error}"


def _device_fields():
    """GPU name, SM count, compute capability, clocks and the driver's CUDA version, as numba sees them."""
    from numba import cuda
    from cuda_kernels.registry import SIMULATOR
    if SIMULATOR:
        return {"gpu": "unavailable: NUMBA_ENABLE_CUDASIM=1 (the simulator)"}
    available = _read(cuda.is_available)
    if available is not True:
        why = NOT_ON_CPU if available is False else available
        return {"gpu": why, "sm_count": why, "clocks": why, "driver_cuda": why}
    device = cuda.get_current_device()
    name = _read(lambda: device.name)
    return {"gpu": name.decode() if isinstance(name, bytes) else str(name),
            "compute_capability": _read(lambda: ".".join(map(str, device.compute_capability))),
            "sm_count": _read(lambda: device.MULTIPROCESSOR_COUNT),
            "clocks": _read(lambda: f"sm {device.CLOCK_RATE / 1e3:.0f} MHz, memory "
                                    f"{device.MEMORY_CLOCK_RATE / 1e3:.0f} MHz (maximum rates the driver reports)"),
            "memory_gib": _read(lambda: round(cuda.current_context().get_memory_info()[1] / 2 ** 30, 1)),
            "driver_cuda": _read(lambda: ".".join(map(str, cuda.cudadrv.driver.driver.get_version())))}


def _torch_fields():
    try:
        import torch
    except Exception as error:
        return {"torch": f"not importable: {type(error).__name__}: {error}"}
    fields = {"torch": torch.__version__, "torch_cuda": str(torch.version.cuda),
              "torch_cudnn": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available()
              else "unavailable"}
    fields["torch_sees_gpu"] = bool(torch.cuda.is_available())
    return fields


def _cuda_features():
    """What this install lacks and the fallback taken (``cuda_kernels.compat``), and the excluded tiles."""
    from cuda_kernels import compat, tile_exclusions
    fields = {name: feature.record() for name, feature in compat.features().items()}
    fields["excluded_tiles"] = tile_exclusions.format_exclusions(tile_exclusions.EXCLUDED)
    return fields


def versions_record():
    """Everything that decides what the numbers mean; fields that cannot be read here say why."""
    import planner
    record = {"python": platform.python_version(), "platform": platform.platform()}
    record.update({name: _package_version(name) for name in PACKAGES})
    record.update(_torch_fields())
    record.update(_device_fields())
    record.update(_nvidia_smi())
    record["planner_build"] = planner.build_kind()
    record["cuda_features"] = _cuda_features()
    record["numba_cuda_simulator"] = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
    return record


def versions_line(record):
    keys = ("python", "numpy", "numba", "numba-cuda", "cuda-core", "cuda-bindings", "torch", "torch_cuda",
            "driver_cuda", "driver_version", "gpu", "sm_count", "clocks", "planner_build")
    return "versions: " + "; ".join(f"{k} {record[k]}" for k in keys if k in record)


# ---- the records -----------------------------------------------------------------------------------------

class RecordWriter:
    """JSON Lines: one record per finished unit, flushed and synced at once (``path`` None: print only).

    Every record has ``unit``, ``status`` ("ok", "failed", "crashed", "interrupted", "not-run", "dry") and
    ``seconds``."""

    def __init__(self, path):
        self.path, self.count = path, 0
        self._file = open(path, "w", encoding="utf-8") if path else None

    def write(self, unit, status, seconds=0.0, **fields):
        record = {"unit": unit, "status": status, "seconds": round(float(seconds), 3), **fields}
        line = json.dumps(record, default=_json_default)
        self.count += 1
        if self._file:
            self._file.write(line + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        print(f"[record {self.count}: {unit} {status}]", flush=True)
        return record

    def close(self):
        if self._file:
            self._file.close()


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "name") and hasattr(value, "blueprint"):   # a StepModel
        return value.name
    return str(value)


TRACEBACK_LINES = 15   # the tail of a crashed unit's traceback kept in its record


class Interrupted(BaseException):
    """SIGTERM (a time limit's ``timeout``) as an exception: the unit running records "interrupted", then
    the run ends (a BaseException, so no unit swallows it)."""


def interrupt_on_sigterm():
    """From now on SIGTERM raises ``Interrupted`` in the main thread (``check.main`` installs it)."""
    import signal

    def stop(signum, frame):
        raise Interrupted(f"{signal.Signals(signum).name} received (a time limit?)")
    signal.signal(signal.SIGTERM, stop)


def traceback_tail(error, lines=TRACEBACK_LINES):
    """The last ``lines`` lines of ``error``'s formatted traceback (where it was raised)."""
    import traceback
    return "".join(traceback.format_exception(type(error), error, error.__traceback__)).splitlines()[-lines:]


class Unit:
    """``with Unit(out, name) as u: ...; u.fields.update(...)``: writes the unit's record when it ends,
    "crashed" with the error and its traceback's tail (the run goes on) if it raised an ``Exception``,
    "interrupted" (the run stops) on ``Interrupted`` or ``KeyboardInterrupt``."""

    def __init__(self, out, name, failures, status="ok"):
        self.out, self.name, self.failures, self.status, self.fields = out, name, failures, status, {}

    def __enter__(self):
        self.started = time.time()
        print(f"\n== {self.name} ==", flush=True)
        return self

    def __exit__(self, kind, error, tb):
        seconds = time.time() - self.started
        if error is not None:
            if isinstance(error, Exception):
                from .step_common import report_crash
                report_crash(self.name, error, self.failures)
            why = {"error": f"{type(error).__name__}: {error}", "traceback": traceback_tail(error)}
            self.out.write(self.name, "crashed" if isinstance(error, Exception) else "interrupted", seconds,
                           **{**self.fields, **why})
        else:
            self.out.write(self.name, self.status, seconds, **self.fields)
        print(f"== {self.name} done in {seconds:.1f} s ==", flush=True)
        return error is None or isinstance(error, Exception)


# ---- the per-kernel breakdown of one step -----------------------------------------------------------------

def timed_replay(entries, stream, new_event, before=None):
    """Run ``entries`` (a recorded step: transfers and kernels) once on ``stream`` with an event
    recorded before the first and after each entry; ``[(kind, name, ms)]`` per entry. Eager replay:
    an event between launches costs ~1 us of device time, so the sum is a little above a graph step.
    ``before(stream)`` runs first, untimed (``spin.spin_before``: the queue stays ahead of the host)."""
    events = [new_event() for _ in range(len(entries) + 1)]
    if before is not None:
        before(stream)
    events[0].record(stream)
    for entry, after in zip(entries, events[1:]):
        entry.run(stream)
        after.record(stream)
    events[-1].synchronize()
    return [(entry.kind, entry.name, float(before.elapsed_time(after)))
            for entry, before, after in zip(entries, events, events[1:])]


def summed_by_kind(timed):
    """``[(name, count, ms, share)]`` sorted by time: kernels by kernel name, transfers by kind."""
    sums = {}
    for kind, name, ms in timed:
        key = name if kind == "kernel" else f"({kind}s)"
        count, total = sums.get(key, (0, 0.0))
        sums[key] = (count + 1, total + ms)
    total = sum(ms for _, ms in sums.values()) or 1.0
    return [(key, count, ms, ms / total) for key, (count, ms) in sorted(sums.items(), key=lambda kv: -kv[1][1])]


def format_breakdown(rows, label):
    lines = [f"  per-kernel time of one training step ({label}):",
             f"  {'kernel':34s} {'launches':>8s} {'ms':>9s} {'share':>6s}"]
    lines += [f"  {name:34s} {count:8d} {ms:9.3f} {share:6.1%}" for name, count, ms, share in rows]
    lines.append(f"  {'total':34s} {sum(r[1] for r in rows):8d} {sum(r[2] for r in rows):9.3f}")
    return "\n".join(lines)


# ---- the line to paste ------------------------------------------------------------------------------------

def _num(value, fmt):
    return format(value, fmt) if isinstance(value, (int, float)) and np.isfinite(value) else "n/a"


def paste_line(model, batch, ours_ips, replay, torch_ips, max_err, arena_mib, torch_mib):
    """``gpu: <model> <batch> ours <img/s> (graph) torch-eager-amp <img/s> ratio <x> | max err vs cpu <e> |
    arena <MiB> vs torch max_memory_allocated <MiB>`` (issue 11); "n/a" for what was not measured."""
    replay = replay.split(" (")[0] + (" fallback" if "fell back" in replay else "")   # "graph", "eager [fallback]"
    ratio = ours_ips / torch_ips if isinstance(ours_ips, float) and isinstance(torch_ips, float) and torch_ips else None
    return (f"gpu: {model} {batch} ours {_num(ours_ips, '.0f')} ({replay}) torch-eager-amp {_num(torch_ips, '.0f')} "
            f"ratio {_num(ratio, '.2f')} | max err vs cpu {_num(max_err, '.2e')} | arena {_num(arena_mib, '.1f')} vs "
            f"torch max_memory_allocated {_num(torch_mib, '.1f')}")
