"""Generation speed: KV-cached vs uncached decoding, and beam-search throughput.

    python -m benchmarks.generation [--quick] [--json OUT.json]

1. A decoder LM of the shakespeare-char preset's size (its d_model, heads, d_ff and layers;
   vocabulary 65, random weights) continues a one-token prompt by 256 tokens greedily, with
   and without the KV cache, with a 512-token context so nothing slides; and once more with
   the preset's own 128-token context, where generation past 128 tokens slides the window
   (the uncached reference then never recomputes more than 128 tokens).
2. The same 256 greedy tokens from Hugging Face ``GPT2LMHeadModel`` of equal size (d_model,
   heads, d_ff, layers, vocabulary, 512 positions; random weights, KV cache on) through
   ``generate()``, the usual way to run a decoder LM. Both in fp32, batch 1.
3. An encoder-decoder of the bible-en-es preset's size (vocabulary 8000, random weights)
   translates 32 random 25-token sentences with beam 4. Random weights never choose <eos>,
   so every hypothesis runs to the length cap (1.5 * 25 + 10 tokens): a worst case.
"""

from __future__ import annotations

import argparse

import torch

from vaswani import build_model
from vaswani.generation import beam_decode, generate

from .common import best_time, interleaved_best, preset_model, report


def cache_speedup(lm, new_tokens: int, repeats: int) -> tuple[float, float]:
    """(cached, uncached) seconds for greedy generation of ``new_tokens``."""
    run = lambda cache: generate(lm, [5], max_new_tokens=new_tokens, temperature=0,  # noqa: E731
                                 bos_id=1, use_cache=cache)
    assert run(True) == run(False), "cached and uncached decoding disagree"
    return best_time(lambda: run(True), repeats), best_time(lambda: run(False), repeats)


def gpt2_like(config):
    """Hugging Face GPT-2 with the shape of a vaswani decoder config (random weights)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(
        vocab_size=config.vocab_size, n_positions=512, n_embd=config.d_model,
        n_layer=config.n_decoder_layers, n_head=config.n_heads, n_inner=config.d_ff,
        activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)).eval()


def hf_greedy(model, new_tokens: int):
    """A function running Hugging Face greedy generation of ``new_tokens``."""
    prompt = torch.tensor([[5]])

    def run():
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 do_sample=False, use_cache=True,
                                 attention_mask=torch.ones_like(prompt))
        assert out.size(1) == 1 + new_tokens

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repeats")
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = parser.parse_args()
    torch.manual_seed(0)
    new_tokens = 64 if args.quick else 256
    repeats = 1 if args.quick else 3

    config = preset_model("shakespeare-char", 65)
    lm = build_model(config.replace(max_len=512)).eval()
    cached, uncached = cache_speedup(lm, new_tokens, repeats)
    short = build_model(config).eval()  # the preset's own 128-token context
    short_cached, short_uncached = cache_speedup(short, new_tokens, repeats)

    hf = gpt2_like(config)
    ours = lambda: generate(lm, [5], max_new_tokens=new_tokens, temperature=0,  # noqa: E731
                            bos_id=1, use_cache=True)
    # timed in alternation with ours, so that drifting load on a shared machine cancels
    cached_again, hf_seconds = interleaved_best([ours, hf_greedy(hf, new_tokens)],
                                                max(3, repeats + 2))
    n_ours = sum(p.numel() for p in lm.parameters())
    n_hf = sum(p.numel() for p in hf.parameters())

    ed = build_model(preset_model("bible-en-es", 8000)).eval()
    sentences = 8 if args.quick else 32
    src = torch.randint(4, 8000, (sentences, 25))
    beam_seconds = best_time(lambda: beam_decode(ed, src, beam=4, bos_id=1, eos_id=2),
                             max(1, repeats - 1))

    results = {
        "lm_new_tokens": new_tokens,
        "lm_cached_tok_s": new_tokens / cached,
        "lm_uncached_tok_s": new_tokens / uncached,
        "cache_speedup": uncached / cached,
        "hf_gpt2_tok_s": new_tokens / hf_seconds,
        "vaswani_vs_hf_gpt2": hf_seconds / cached_again,
        "params_vaswani": n_ours, "params_hf_gpt2": n_hf,
        "preset_context": config.max_len,
        "cache_speedup_preset_context": short_uncached / short_cached,
        "beam4_sentences": sentences,
        "beam4_sentences_s": sentences / beam_seconds,
    }
    report("Generation (CPU, greedy LM and beam-4 translation)", [
        (f"LM greedy, {new_tokens} new tokens, KV cache",
         f"{results['lm_cached_tok_s']:.0f} tok/s"),
        (f"LM greedy, {new_tokens} new tokens, no cache",
         f"{results['lm_uncached_tok_s']:.0f} tok/s"),
        ("cache speed-up (512-token context)", f"{results['cache_speedup']:.1f}x"),
        (f"Hugging Face GPT-2 generate(), same size ({n_hf:,} vs {n_ours:,} params)",
         f"{results['hf_gpt2_tok_s']:.0f} tok/s"),
        ("vaswani cached / Hugging Face GPT-2", f"{results['vaswani_vs_hf_gpt2']:.1f}x"),
        (f"cache speed-up (preset's {config.max_len}-token context, sliding)",
         f"{results['cache_speedup_preset_context']:.1f}x"),
        (f"encoder-decoder beam 4, {sentences} sentences", f"{results['beam4_sentences_s']:.1f} "
         "sentences/s"),
    ], results, args.json)


if __name__ == "__main__":
    main()
