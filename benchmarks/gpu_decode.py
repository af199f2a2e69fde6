"""The decode part of ``python -m benchmarks.gpu`` (``--only decode``): a GPT-2-small-shaped
language model, random weights, greedy through vaswani's engine (slot KV cache, CUDA graphs)
against Hugging Face ``generate``, at batch 1 and 32. ``b`` is benchmarks.gpu's ``Bench``."""

from __future__ import annotations

import torch

from vaswani import ModelConfig, build_model


def gpt2_model(s, device):
    """The GPT-2-shaped model of ``s`` (a Shape), with a CPU's paths only for a CPU."""
    return build_model(ModelConfig(arch="decoder", d_model=s.d, n_heads=s.heads, d_ff=s.d_ff,
                                   n_layers=s.layers, vocab_size=s.vocab, dropout=0.0,
                                   norm_first=True, positional="learned", tie_embeddings=True,
                                   activation="gelu", max_len=max(s.length, 1024)),
                       fast=device.type == "cpu")


def decode_rows(b) -> tuple[list, dict]:
    s = b.shapes["gpt2"]
    new = 32 if b.quick else 256
    torch.manual_seed(0)
    model = gpt2_model(s, b.device).to(b.device, b.dtype).eval()
    rows, out = [], {}
    for batch in (1, 32):
        prompts = [b.rand(s.vocab, 16).tolist() for _ in range(batch)]
        fns = {"vaswani engine": engine_decode(model, prompts, new)}
        try:
            fns["HF generate"] = hf_decode(b, s, prompts, new)
        except ImportError:
            pass
        t = b.times(fns)
        for who, seconds in t.items():
            rate = batch * new / seconds
            rows.append((f"greedy decode, batch {batch}: {who}", f"{rate:,.0f} tok/s"))
            out[f"decode_b{batch}_{who}_tok_s"] = rate
    return rows, out


def engine_decode(model, prompts: list[list[int]], new: int):
    from vaswani.engine import Engine, EngineConfig, Params, Request
    from vaswani.generation.rules import Rules

    engine = Engine(model, bos_id=1, eos_id=2, config=EngineConfig(max_rows=len(prompts)))
    params = Params(max_new_tokens=new, rules=Rules(min_length=new))  # every row: `new` tokens
    return lambda: engine.run([Request(p, params) for p in prompts])


def hf_decode(b, s, prompts: list[list[int]], new: int):
    import transformers

    hf_cfg = transformers.GPT2Config(vocab_size=s.vocab, n_positions=1024, n_embd=s.d,
                                     n_layer=s.layers, n_head=s.heads)
    hf = transformers.GPT2LMHeadModel(hf_cfg).to(b.device, b.dtype).eval()
    ids = torch.tensor(prompts, device=b.device)

    @torch.no_grad()
    def decode():
        hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                    pad_token_id=0)

    return decode
