#!/usr/bin/env bash
# Prepared passes over a lent GPU machine (no package registry there), each under 10 minutes,
# so that several short calls of a 15-minute lease finish the work: the GPU benchmarks first,
# on an idle card (each part under its own limit, under 10 minutes in all), then the CUDA test
# suite, whole (`tests 1/1`: about 3 minutes with 12 processes on an H200) or in shards whose
# results are recorded (which shard passed at which commit: scripts/gpu_shards.py). Logs and JSON go to
# $OUT (or ./gpu-out), and each test failure to $OUT/failures.txt as it happens
# (scripts/pytest_failures.py).
#
#   here:   bash scripts/gpu_setup.sh fetch            # .whl/ and .gpu-cache/, git-ignored
#   there:  bash scripts/gpu_check.sh bench            # carry .whl and .gpu-cache
#           bash scripts/gpu_check.sh tests 1/4        # shard 1 of 4 (then 2/4, ...)
#   here:   python scripts/gpu_shards.py record gpu-out/shard-*.json   # into the record
#           python scripts/gpu_shards.py status 4      # which shards passed at what commit
#
# bench [PARTS]: the parts of `python -m benchmarks.gpu --only ...` (default "loss seq2seq lm
# decode"), each under its own limit; BENCH_ARGS= adds arguments (default --repeats 5
# --compile: every training contender eager and compiled, as docs/performance.md's rows; 5
# repeats, since Hugging Face's eager generate takes seconds a call). tests K/N: shard K of N of the folders
# whose code runs on the device (not the multi-process, data and benchmark tests, which run
# on the CPU whatever --device says); PYTEST_ARGS= adds arguments, TEST_LIMIT= the seconds
# (default 540).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
eval "$(bash scripts/gpu_setup.sh install)" || exit 1
export PYTHONUNBUFFERED=1
MODE="${1:-bench}"
shift || true

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
    python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
    nproc
} 2>&1 | tee "$OUT/env.txt"

if [ "$MODE" = bench ]; then
    # (compiling: seq2seq 202 s, lm 65 s, loss 19 s on the H200 of 2026-12-04)
    declare -A LIMIT=([loss]=60 [seq2seq]=240 [lm]=150 [decode]=${DECODE_LIMIT:-150})
    for part in ${1:-loss seq2seq lm decode}; do
        echo "== benchmarks.gpu --only $part"
        timeout -s ABRT "${LIMIT[$part]:-120}" python3 -X faulthandler -m benchmarks.gpu --only "$part" ${BENCH_ARGS:---repeats 5 --compile} \
            --json "$OUT/gpu-$part.json" 2>&1 | tee -a "$OUT/bench.log" | tail -25
        echo "rc=${PIPESTATUS[0]}"
    done
elif [ "$MODE" = tests ]; then
    SHARD="${1:?tests K/N: which shard, e.g. 1/4}"
    K="${SHARD%/*}"; N="${SHARD#*/}"
    FILES="$(python3 scripts/gpu_shards.py files "$K" "$N")" || exit 2
    VERSION="$(python3 scripts/gpu_shards.py version)"
    echo "== pytest --device cuda, shard $K/$N at $VERSION: $FILES"
    START=$(date +%s)
    # each worker's CPU work on its share of the cores: 14 processes of 16 threads each on 16
    # cores timed out a CPU translation and an import (60 s each; the H200, 2026-11-28)
    WORKERS="${WORKERS:-12}"
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / WORKERS > 0 ? $(nproc) / WORKERS : 1 ))}"
    # shellcheck disable=SC2086
    timeout "${TEST_LIMIT:-540}" python3 -m pytest --device cuda $FILES -q -n "$WORKERS" \
        --timeout 240 -p no:cacheprovider -p scripts.pytest_failures -rfE --tb=short ${PYTEST_ARGS:-} \
        >"$OUT/pytest-$K-of-$N.log" 2>&1
    RC=$?
    echo "rc=$RC"
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest-$K-of-$N.log" | tail -60
    python3 scripts/gpu_shards.py result "$OUT/pytest-$K-of-$N.log" "$K/$N" "$VERSION" "$RC" \
        "$(( $(date +%s) - START ))" "$(python3 -c 'import torch; print(torch.cuda.get_device_name())')" \
        >"$OUT/shard-$K-of-$N.json"
else
    echo "gpu_check: unknown mode $MODE (bench or tests K/N)" >&2
    exit 2
fi
