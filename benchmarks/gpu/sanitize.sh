#!/usr/bin/env bash
# The runbook's second command: bash benchmarks/gpu/sanitize.sh OUT_DIR   (docs/gpu-runbook.md)
# compute-sanitizer racecheck + memcheck on the preflight cases; writes OUT_DIR/sanitizer.jsonl and log.txt.
set -u
OUT=${1:?usage: bash benchmarks/gpu/sanitize.sh OUT_DIR}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.." || exit 2
export BLUEPRINT_PURE_PYTHON=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -d /tmp/blueprint-site ]; then export PYTHONPATH="/tmp/blueprint-site:$PYTHONPATH"; fi
timeout -k 10 560 "${PYTHON:-python3}" -m benchmarks.gpu.sanitize "$OUT" 2>&1 | tee "$OUT/log.txt"
