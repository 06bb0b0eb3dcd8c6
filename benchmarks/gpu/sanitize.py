"""The runbook's second command: compute-sanitizer's racecheck and memcheck on the preflight cases.

    python3 -m benchmarks.gpu.sanitize OUT_DIR          # on the GPU machine (bash benchmarks/gpu/sanitize.sh)

Compiles the cases' kernels first (side by side, into a disk cache, outside the sanitizer), then runs the
tensor-core preflight checks and every tile case (tile_cases) in one process under each tool, and writes
``OUT_DIR/sanitizer.jsonl``: one record per tool with its exit status, its summary line and the first
reported hazards or errors. Where compute-sanitizer is missing or refuses the device, the record says so.
``cases`` (the process the tool runs): ``python3 -m benchmarks.gpu.sanitize --cases``."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOLS = ("racecheck", "memcheck")
TOOL_TIMEOUT_S = 220
PREFLIGHT_CASES = ("mma-forward", "mma-dynamic")
SUMMARY = re.compile(r"(RACECHECK SUMMARY|ERROR SUMMARY|LEAK SUMMARY).*")
REFUSED = ("Device not supported", "Unable to find injection library", "error 999", "Target application terminated")


FAMILY = {"forward": "conv2d_forward", "dgrad": "conv2d_backward_data", "wgrad": "conv2d_backward_weight"}


def case_kernels():
    """The tensor-core kernels the tile cases launch."""
    from .tile_cases import CASES
    return sorted({f"mma_{FAMILY[c.direction]}_{c.tile.name}" for c in CASES.values()})


def run_cases():
    """Inside the sanitizer: the preflight's tensor-core checks and every tile case, one after another."""
    from cuda_kernels import graph
    from .preflight import CHECKS, run_check
    from .tile_cases import CASES, run_case
    stream = graph.new_stream()
    failed = 0
    for check in (c for c in CHECKS if c.name in PREFLIGHT_CASES):
        result = run_check(check, stream)
        failed += result["status"] == "FAIL"
        print(f"case {check.name}: {result['status']} {result.get('detail') or result.get('error')}", flush=True)
    for i, name in enumerate(CASES):
        result = run_case(name, seed=i)
        failed += not result["ok"]
        print(f"case {name}: {'PASS' if result['ok'] else 'FAIL'} max |error| {result['max_error']:.2e}", flush=True)
    return 1 if failed else 0


def tool_record(tool, returncode, output, seconds):
    """The record of one tool's run from its exit status and output."""
    lines = output.splitlines()
    summary = [m.group(0) for m in map(SUMMARY.search, lines) if m]
    refused = next((line for line in lines if any(r in line for r in REFUSED)), "")
    hazards = [line for line in lines if line.startswith("========= ") and not SUMMARY.search(line)
               and ("Error" in line or "Race" in line)][:10]
    cases = [line for line in lines if line.startswith("case ")]
    clean = returncode == 0 and not hazards and all(re.search(r"\b0 (errors|hazards)", s) for s in summary)
    status = "refused" if refused and not cases else "ok" if clean else "failed"
    return {"unit": f"compute-sanitizer {tool}", "status": status, "seconds": round(seconds, 1),
            "exit": returncode, "summary": summary, "hazards": hazards, "refused": refused, "cases": cases}


def main(out_dir):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        records.append({"unit": "compute-sanitizer", "status": "refused", "refused": "compute-sanitizer is not on "
                        "the PATH of this machine"})
    else:
        from .isolate import run_many, UnitCall
        from .quick_run import PARALLEL, warmup_groups
        env = dict(os.environ, NUMBA_CACHE_DIR=os.environ.get("NUMBA_CACHE_DIR") or tempfile.mkdtemp(),
                   BLUEPRINT_CUDA_CACHE="1", BLUEPRINT_PURE_PYTHON="1")
        calls = [UnitCall(f"compile {i}", "benchmarks.gpu.units", "compile_kernels", {"names": g}, 240)
                 for i, g in enumerate(warmup_groups(case_kernels(), PARALLEL))]
        compiled = run_many(calls, parallel=PARALLEL, env=env)
        records.append({"unit": "compile", "status": "ok" if all(o.status == "ok" for o in compiled) else "failed",
                        "errors": [o.error for o in compiled if o.error]})
        env["BLUEPRINT_CUDA_CACHE"] = "read"
        for tool in TOOLS:
            started = time.monotonic()
            try:
                run = subprocess.run([sanitizer, "--tool", tool, "--error-exitcode", "99", sys.executable, "-m",
                                      "benchmarks.gpu.sanitize", "--cases"], env=env, capture_output=True, text=True,
                                     timeout=TOOL_TIMEOUT_S)
                record = tool_record(tool, run.returncode, run.stdout + run.stderr, time.monotonic() - started)
            except subprocess.TimeoutExpired as expired:
                output = (expired.stdout or b"").decode(errors="replace") if isinstance(expired.stdout, bytes) \
                    else (expired.stdout or "")
                record = dict(tool_record(tool, -9, output, time.monotonic() - started), status="timeout")
            records.append(record)
            print(f"compute-sanitizer {tool}: {record['status']} {' | '.join(record['summary'])} "
                  f"{record['refused']}", flush=True)
    with open(out / "sanitizer.jsonl", "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    line = "sanitizer: " + "; ".join(f"{r['unit']} {r['status']}" for r in records)
    print(line)
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(run_cases() if sys.argv[1:] == ["--cases"] else main(sys.argv[1]))
