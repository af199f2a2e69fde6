"""llama.cpp on a GGUF file, as its Python users run it: ``llama_cpp.Llama`` and its
``create_completion``, in the benchmark's own venv (``benchmarks.llm`` makes it), in a process
of its own. It imports nothing of vaswani, torch or numpy's users; it reads a job on its
command line and prints one JSON line.

    PEER_PYTHON benchmarks/llama_cpp_child.py '{"gguf": ..., "threads": 2, "prompt": [...],
                                                  "long_prompt": [...], "new_tokens": 128,
                                                  "agree_tokens": 32}'

* prompt processing: the long prompt's prefill to its first token (``max_tokens=1``), best
  of 3, as tokens/s;
* generation: ``new_tokens`` greedy tokens after the prompt, streamed, the time after the
  first token over the tokens after it, best of 3;
* the first ``agree_tokens`` greedy token ids after the prompt (``Llama.generate``, the
  same sampler, untimed), to compare with vaswani's apart from the timing;
* peak resident memory of the process (loading included).
"""

import json
import re
import sys
import time

from llama_cpp import Llama


def peak_kb() -> int:
    """This process's own peak resident memory (VmHWM; ru_maxrss would carry over the parent's,
    as vaswani.devices.peak_resident_bytes explains)."""
    with open("/proc/self/status") as f:
        return int(re.search(r"^VmHWM:\s+(\d+) kB", f.read(), re.M)[1])

job = json.loads(sys.argv[1])
llm = Llama(model_path=job["gguf"], n_threads=job["threads"], n_threads_batch=job["threads"],
            n_batch=512, verbose=False)  # its default context (512 tokens) holds both prompts
GREEDY = dict(temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)


def prefill() -> float:
    llm.reset()  # no prefix of the prompt reused from the previous call
    start = time.perf_counter()
    llm.create_completion(job["long_prompt"], max_tokens=1, **GREEDY)
    return time.perf_counter() - start


def generation() -> tuple[float, int]:
    llm.reset()
    first, chunks = None, 0
    for chunk in llm.create_completion(job["prompt"], max_tokens=job["new_tokens"],
                                       stream=True, **GREEDY):
        if chunk["choices"][0]["finish_reason"] is not None:
            break  # the closing chunk carries no token
        chunks += 1
        if first is None:
            first = time.perf_counter()
    return (time.perf_counter() - first) / max(1, chunks - 1), chunks


prefill()  # warm-up
best_prefill = min(prefill() for _ in range(3))
per_token, tokens = min(generation() for _ in range(3))
llm.reset()
agree = []
for token in llm.generate(job["prompt"], temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                          repeat_penalty=1.0, reset=True):
    agree.append(int(token))
    if len(agree) == job["agree_tokens"] or token == llm.token_eos():
        break
print(json.dumps({
    "prompt_tokens_per_s": round(len(job["long_prompt"]) / best_prefill, 1),
    "generation_tokens_per_s": round(1 / per_token, 1), "generated": tokens,
    "peak_rss_mb": round(peak_kb() / 1024),
    "greedy_ids": agree}))
