#!/usr/bin/env bash
# On a CPU machine with a network: the audited wheels for the GPU machine (Python 3.12, manylinux x86-64)
# into .whl/ (git-ignored), carried with the source tree only when first_run.sh's assumptions test fails
# against the GPU machine's own packages (docs/gpu-runbook.md). Usage: bash benchmarks/gpu/download_wheels.sh
set -eu
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
# the versions tests/cuda/test_gpu_assumptions.py was written against (CUDA-NOTES.md); one version of each
WHEELS="numba-cuda==0.30.4 cuda-core==1.2.2 cuda-bindings==13.5.0 cuda-pathfinder==1.9.1"
PLATFORMS=""
for n in 2_28 2_27 2_17; do PLATFORMS="$PLATFORMS --platform manylinux_${n}_x86_64"; done
mkdir -p .whl
for wheel in $WHEELS; do
    "${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        $PLATFORMS --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$wheel"
done
ls -l .whl
