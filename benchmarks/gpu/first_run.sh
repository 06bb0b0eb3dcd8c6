#!/usr/bin/env bash
# The first GPU run, one command: bash benchmarks/gpu/first_run.sh [--dry] OUT_DIR   (docs/gpu-runbook.md)
#
# Runs from the source tree with the machine's own python3 (pure-Python planner, no build step). First a
# no-GPU test of what the code assumes of numba-cuda / cuda-core / cuda-bindings against the installed
# versions (tests/cuda/test_gpu_assumptions.py); only if it fails are the wheels carried in .whl/ installed
# (benchmarks/gpu/download_wheels.sh makes them) and the test repeated. Then `python -m benchmarks.gpu.check
# --quick` with the time left (560 s in all). Writes at most 4 files under OUT_DIR: gpu.jsonl (one record
# per unit), log.txt (everything printed), assumptions.txt, summary.txt; prints the paste line last.
# --dry: no GPU (CI and the CPU machines): the same steps with `--dry-run --quick`.
set -u
DRY=0
if [ "${1:-}" = "--dry" ]; then DRY=1; shift; fi
OUT=${1:?usage: bash benchmarks/gpu/first_run.sh [--dry] OUT_DIR}
WALL_S=${FIRST_RUN_WALL_S:-560}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.." || exit 2          # the repository root
PY=${PYTHON:-python3}
START=$(date +%s)
export BLUEPRINT_PURE_PYTHON=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$(mktemp -d /tmp/blueprint-numba-cache.XXXXXX)}
unset NUMBA_ENABLE_CUDASIM

assumptions() {
    timeout 90 "$PY" -m pytest -q -p no:cacheprovider tests/cuda/test_gpu_assumptions.py >> "$OUT/assumptions.txt" 2>&1
}

run() {
    echo "first_run: $(date -u +%FT%TZ), $("$PY" --version 2>&1) at $(command -v "$PY"), dry=$DRY, cache $NUMBA_CACHE_DIR"
    if assumptions; then
        echo "assumptions: passed with this machine's packages ($(tail -n 1 "$OUT/assumptions.txt"))"
    elif ls .whl/*.whl > /dev/null 2>&1; then
        echo "assumptions: FAILED with this machine's packages; installing the wheels carried in .whl/"
        if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target /tmp/blueprint-site .whl/*.whl; then
            export PYTHONPATH="/tmp/blueprint-site:$PYTHONPATH"
            echo "== with the wheels ==" >> "$OUT/assumptions.txt"
            if assumptions; then echo "assumptions: passed with the wheels"
            else echo "assumptions: still FAILED with the wheels (assumptions.txt); running on, the fallbacks are recorded"; fi
        else
            echo "assumptions: the wheels did not install; running with this machine's packages"
        fi
    else
        echo "assumptions: FAILED and no .whl/ was carried; running on, the fallbacks are recorded (assumptions.txt)"
    fi
    local left=$(( WALL_S - ($(date +%s) - START) - 20 ))
    if [ "$DRY" = 1 ]; then
        timeout -k 10 "$left" "$PY" -m benchmarks.gpu.check --dry-run --quick --json "$OUT/gpu.jsonl"
    else   # the budget ends 20 s before the timeout: the summary record is written either way
        timeout -k 10 "$left" "$PY" -m benchmarks.gpu.check --quick --budget $(( left - 20 )) --json "$OUT/gpu.jsonl"
    fi
    echo "check: exit $?"
}

run 2>&1 | tee "$OUT/log.txt"
PASTE=$(grep '^gpu: ' "$OUT/log.txt" | tail -n 1)
VERDICT=$(grep -E '^(FAILED|INCOMPLETE|INTERRUPTED|dry run ok|all checks passed)' "$OUT/log.txt" | tail -n 1)
{
    echo "first_run.sh dry=$DRY: $(( $(date +%s) - START )) s wall"
    echo "${VERDICT:-no verdict: the check ended early (log.txt)}"
    grep '^check: exit' "$OUT/log.txt" | tail -n 1
    grep -E '^  +[0-9.]+ s  total' "$OUT/log.txt" | tail -n 1
    echo "files: $(cd "$OUT" && ls | tr '\n' ' ')"
    echo "${PASTE:-gpu: no paste line (the check ended before its summary; log.txt)}"
} > "$OUT/summary.txt"
cat "$OUT/summary.txt"
