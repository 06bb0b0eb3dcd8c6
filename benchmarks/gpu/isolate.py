"""Each unit that launches kernels for the first time runs in a spawned subprocess with its own timeout.

A sticky CUDA error (illegal address, misaligned access, trap) destroys the process's context: every
later launch in that process fails. So the preflight cases, the kernel rows and the step units run as
``python -m benchmarks.gpu.isolate CALL.json RESULT.json`` children: a fresh process, a fresh context.
The child imports ``module``, calls ``function(**kwargs)`` (a JSON-able dict back) and writes it to
RESULT.json. What the parent records:

    ok         the function returned a dict without ``"ok": False``
    failed     it returned ``"ok": False`` (a check that ran and found a difference)
    crashed    it raised (the error and its traceback's tail come back), or the process died without a
               result: a nonzero exit (``os._exit``, a fault the runtime turned into an exit) or a signal
    timeout    it ran past its ``timeout_s``: its whole process group is killed

The child's output goes to the parent's stdout (first_run.sh writes that to the log)."""
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRACEBACK_LINES = 15


def _plain(value):
    """JSON for what ``json`` cannot write: numpy scalars and arrays as numbers and lists, the rest as text."""
    return value.tolist() if hasattr(value, "tolist") else str(value)


@dataclass(frozen=True)
class UnitCall:
    """``module.function(**kwargs)`` in a fresh process, at most ``timeout_s`` seconds."""
    name: str
    module: str
    function: str
    kwargs: dict = field(default_factory=dict)
    timeout_s: float = 60.0


@dataclass(frozen=True)
class UnitOutcome:
    name: str
    status: str          # "ok", "failed", "crashed" or "timeout"
    seconds: float
    result: dict         # what the function returned ({} when it did not return)
    error: str = ""      # why it is not "ok" (empty when it is)

    def record(self):
        """The fields of this unit's JSON Lines record."""
        fields = dict(self.result)
        if self.error:
            fields["error"] = self.error
        return fields


def _exit_reason(returncode):
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode} without writing a result"


def outcome_of(call, returncode, timed_out, written, seconds):
    """The ``UnitOutcome`` of a finished child: its exit, whether it timed out, and what it wrote (None: nothing)."""
    if timed_out:
        return UnitOutcome(call.name, "timeout", seconds, written or {},
                           f"ran past its {call.timeout_s:g} s timeout; its process group was killed")
    if written is None or (returncode != 0 and "raised" not in written):
        return UnitOutcome(call.name, "crashed", seconds, {}, _exit_reason(returncode))
    if "raised" in written:
        return UnitOutcome(call.name, "crashed", seconds, {"traceback": written.get("traceback", [])},
                           written["raised"])
    result = written["result"]
    if not isinstance(result, dict):
        return UnitOutcome(call.name, "crashed", seconds, {}, f"returned {type(result).__name__}, expected a dict")
    return UnitOutcome(call.name, "failed" if result.get("ok") is False else "ok", seconds, result,
                       "" if result.get("ok") is not False else str(result.get("error", "the check failed")))


def run_isolated(call, env=None):
    """Run ``call`` in a spawned ``python -m benchmarks.gpu.isolate`` child; its ``UnitOutcome``. Never raises
    for what the child does."""
    with tempfile.TemporaryDirectory(prefix="gpu-unit-") as folder:
        call_path, result_path = Path(folder) / "call.json", Path(folder) / "result.json"
        call_path.write_text(json.dumps({"module": call.module, "function": call.function, "kwargs": call.kwargs}))
        started = time.monotonic()
        sys.stdout.flush()
        child = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu.isolate", str(call_path), str(result_path)],
                                 cwd=REPO, env=env, start_new_session=True)
        timed_out = False
        try:
            child.wait(timeout=call.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:   # a timeout, or the parent interrupted (SIGTERM): the child and its children go too
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        seconds = time.monotonic() - started
        written = json.loads(result_path.read_text()) if result_path.exists() else None
        return outcome_of(call, child.returncode, timed_out, written, seconds)


def run_in_process(call, env=None):
    """``call`` in this process (the simulator tests and the dry run, where no kernel can fault); its outcome."""
    started = time.monotonic()
    try:
        result = getattr(importlib.import_module(call.module), call.function)(**call.kwargs)
        written = {"result": json.loads(json.dumps(result, default=_plain))}
    except Exception as error:
        lines = "".join(traceback.format_exception(type(error), error, error.__traceback__)).splitlines()
        written = {"raised": f"{type(error).__name__}: {error}", "traceback": lines[-TRACEBACK_LINES:]}
    return outcome_of(call, 0 if "result" in written else 1, False, written, time.monotonic() - started)


def run_many(calls, runner=run_isolated, parallel=1, env=None):
    """``[UnitOutcome]`` of ``calls`` in order, at most ``parallel`` children at a time."""
    if parallel <= 1 or len(calls) <= 1:
        return [runner(call, env) for call in calls]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(lambda call: runner(call, env), calls))


def child_main(call_path, result_path):
    """In the child: call the function, write ``{"result": ...}`` or ``{"raised": ..., "traceback": [...]}``."""
    call = json.loads(Path(call_path).read_text())
    try:
        function = getattr(importlib.import_module(call["module"]), call["function"])
        written = {"result": function(**call["kwargs"])}
        status = 0
    except Exception as error:
        lines = "".join(traceback.format_exception(type(error), error, error.__traceback__)).splitlines()
        written, status = {"raised": f"{type(error).__name__}: {error}", "traceback": lines[-TRACEBACK_LINES:]}, 1
    Path(result_path).write_text(json.dumps(written, default=_plain))
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(child_main(*sys.argv[1:3]))
