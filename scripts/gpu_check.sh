#!/usr/bin/env bash
# One prepared pass over a lent GPU machine (no package registry there): the GPU benchmarks
# first, on an idle card, then the test suite on cuda. Every part has its own time limit so
# that a hang in one still brings back the others (at most about 9 minutes in all, inside
# one call of a 15-minute lease); logs and JSON go to $OUT (or ./gpu-out), and each test
# failure to $OUT/failures.txt as it happens (scripts/pytest_failures.py).
#
#   here:   bash scripts/gpu_setup.sh fetch            # .whl/ and .gpu-cache/, git-ignored
#   there:  bash scripts/gpu_check.sh [PARTS]          # carry .whl and .gpu-cache
#
# PARTS (default "loss seq2seq lm decode tests"): any of the benchmark parts of
# `python -m benchmarks.gpu --only ...` and "tests" (pytest --device cuda, on several
# processes, over the folders whose code runs on the device: not the multi-process, data and
# benchmark tests, which run on the CPU whatever --device says and took most of the first
# run's time). TESTS= names other test paths ("tests" for all), PYTEST_ARGS= adds arguments,
# BENCH_ARGS= too for the benchmarks (default --repeats 5: Hugging Face's eager generate
# takes seconds a call).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
eval "$(bash scripts/gpu_setup.sh install)" || exit 1
export PYTHONUNBUFFERED=1
PARTS="${1:-loss seq2seq lm decode tests}"
DEVICE_TESTS="tests/cuda tests/nn tests/models tests/generation tests/engine tests/inference
    tests/serve tests/export tests/training tests/test_devices.py tests/test_legacy_runs.py"

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
    python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
    nproc
} 2>&1 | tee "$OUT/env.txt"

declare -A LIMIT=([loss]=45 [seq2seq]=100 [lm]=120 [decode]=${DECODE_LIMIT:-90})
for part in $PARTS; do
    [ "$part" = tests ] && continue
    echo "== benchmarks.gpu --only $part"
    timeout -s ABRT "${LIMIT[$part]:-120}" python3 -X faulthandler -m benchmarks.gpu --only "$part" ${BENCH_ARGS:---repeats 5} \
        --json "$OUT/gpu-$part.json" 2>&1 | tee -a "$OUT/bench.log" | tail -25
    echo "rc=${PIPESTATUS[0]}"
done

if [[ " $PARTS " == *" tests "* ]]; then
    echo "== pytest --device cuda ${TESTS:-$DEVICE_TESTS}"
    # shellcheck disable=SC2086
    timeout "${TEST_LIMIT:-200}" python3 -m pytest --device cuda ${TESTS:-$DEVICE_TESTS} -q -n "${WORKERS:-12}" \
        --timeout 60 -p no:cacheprovider -p scripts.pytest_failures -rfE --tb=short ${PYTEST_ARGS:-} \
        >"$OUT/pytest.log" 2>&1
    echo "rc=$?"
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -60
fi
