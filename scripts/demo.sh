#!/usr/bin/env bash
# `make demo`: train the copy task through the CLI, then show the model copying.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.venv/bin/vaswani
RUN=runs/demo-copy

echo "== Training a 2+2-layer encoder-decoder on the copy task (about a minute) =="
$V train configs/copy-task.toml --out "$RUN" --overwrite

echo
echo "== Copying strings it has never seen (vaswani translate, beam 4) =="
printf 'abcdefghij\njjiihhggff\nabab\ncafebabe\nfedcbaabcdefgghhiijj\n' > "$RUN/demo-input.txt"
paste "$RUN/demo-input.txt" <($V translate "$RUN" --input "$RUN/demo-input.txt") \
  | awk -F'\t' '{ printf "  %-22s -> %-22s %s\n", $1, $2, ($1 == $2 ? "ok" : "WRONG") }'

$V attention "$RUN" --text "abcdefghij" --out "$RUN/attention.png" >/dev/null
cat <<MSG

The run lives in $RUN (config.toml, tokenizer/, model.safetensors, last/, metrics.jsonl,
loss.png, attention.png). Try next:
  $V translate $RUN --beam 4 --n-best 2        # type strings of a-j, Ctrl-D to end
  $V attention $RUN --text "abcabc" --out att.png --all-heads
  $V train --resume $RUN --set train.max_steps=1500
MSG
