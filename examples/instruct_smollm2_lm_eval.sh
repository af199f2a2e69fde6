#!/usr/bin/env bash
# Tutorial, part 2: score SmolLM2 before and after instruction-tuning
# (examples/instruct_smollm2.sh, docs/tutorials/instruct-smollm2.md) with
# lm-evaluation-harness against `vaswani serve`, both runs served on one copy of the base.
# Run in the folder where part 1 ran. LM_EVAL names lm-eval's command (default
# ~/lm-eval/bin/lm_eval: docs/how-to/lm-eval.md installs it in an environment of its own);
# ITEMS=N scores N held-out verses instead of 100; PORT=N serves on that port (8011).
set -euo pipefail
LM_EVAL=${LM_EVAL:-~/lm-eval/bin/lm_eval}
ITEMS=${ITEMS:-100}
PORT=${PORT:-8011}

# 1. The task: for a held-out verse (Mark, John, ...: never trained on), which of four
#    Spanish verses is the answer? The question is the user's turn in the model's own chat
#    template; each choice is the assistant's answer, its log-likelihood summed by lm-eval.
mkdir -p lm_eval_verses
ITEMS=$ITEMS python - <<'PY'
import json
import os
from pathlib import Path

import vaswani
from vaswani.data.chat import render
from vaswani.data.prepare import dataset_dir
from vaswani.data.registry import default_cache

test = dataset_dir(default_cache(), "bible-en-es-chat") / "test.jsonl"
talks = [json.loads(line)["messages"] for line in test.read_text().splitlines()]
run = vaswani.load("runs/smollm2")
tok = run.source_tokenizer
n = int(os.environ["ITEMS"])
step = len(talks) // n  # spread over the held-out books
with open("lm_eval_verses/verses.jsonl", "w") as out:
    for i in range(n):
        talk = talks[i * step]
        others = [talks[(i * step + k * 97) % len(talks)][1]["content"] for k in (1, 2, 3)]
        answer = i % 4
        choices = others[:answer] + [talk[1]["content"]] + others[answer:]
        prompt = render(run.chat_template, talk[:1], bos_token=tok.token(tok.bos_id),
                        eos_token=tok.token(tok.eos_id))
        out.write(json.dumps({"prompt": prompt, "choices": choices, "answer": answer}) + "\n")
PY
cat > lm_eval_verses/verses_es.yaml <<'YAML'
task: verses_es
dataset_path: json
dataset_kwargs:
  data_files:
    test: lm_eval_verses/verses.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{prompt}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm
metadata:
  version: 1.0
YAML

# 2. The tokenizer lm-eval counts with (the base's Hugging Face folder), and both runs served:
#    the LoRA run's adapters over one copy of the base (docs/how-to/lora.md).
vaswani export runs/smollm2 --format hf --out exports/smollm2-hf --overwrite
vaswani serve runs/smollm2 runs/smollm2-bible --port "$PORT" &
SERVER=$!
trap 'kill $SERVER' EXIT
until curl -sf "127.0.0.1:$PORT/health" > /dev/null; do sleep 1; done

# 3. The same task, before and after.
for model in smollm2 smollm2-bible; do
  "$LM_EVAL" --model local-completions \
    --model_args "model=$model,base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer_backend=huggingface,tokenizer=exports/smollm2-hf,tokenized_requests=True,num_concurrent=1" \
    --tasks verses_es --include_path lm_eval_verses --batch_size 1 \
    --output_path "out/$model" 2> "lm_eval_verses/$model.log"  # (its progress: the log)
done
