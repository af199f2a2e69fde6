"""GGUF files (llama.cpp's format) of LLaMA and Gemma 3 models -> Hugging Face-named fp32
weights, a ModelConfig and a tokenizer (byte-level BPE, or SentencePiece's BPE).

The file is read by :mod:`.gguf_file`; quantized tensors (Q4_1, Q4_K, Q8_0, ...) are
dequantized with PyPI ``gguf``. llama.cpp's
converter permutes the rows of LLaMA's q and k projections so that rotary pairs are
interleaved; vaswani (like Hugging Face) rotates halves, so the permutation is undone here.
Gemma's norms are stored with their 1 added; Hugging Face's names hold them without it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ..config import ModelConfig
from . import gemma3
from .gguf_file import GGUFFile
from .llama import llama_config

# GGUF tensor name (per block "blk.N.") -> Hugging Face LlamaForCausalLM name
_TOP = {"token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
          "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_GEMMA3_BLOCK = {**_BLOCK, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
                 "post_attention_norm": "post_attention_layernorm",
                 "ffn_norm": "pre_feedforward_layernorm",
                 "post_ffw_norm": "post_feedforward_layernorm"}
ARCHITECTURES = ("llama", "gemma3")


def _field(reader: GGUFFile, key: str, default=None):
    value = reader.fields.get(key)
    return default if value is None else value


def unpermute(w: Tensor, n_heads: int) -> Tensor:
    """Undo llama.cpp's q/k row permutation: within each head, rows were reordered from
    [first half; second half] to interleaved pairs."""
    rows = w.shape[0]
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


class GGUFError(ValueError):
    """A GGUF file that cannot be read as a LLaMA checkpoint; the message names the file."""


def read_gguf(path: Path) -> tuple[ModelConfig, dict[str, Tensor], dict]:
    """(config, Hugging Face-named fp32 state dict, fields: the architecture and the
    tokenizer's) of a LLaMA or Gemma 3 GGUF file.
    A damaged or incomplete file (random bytes, a truncated download, missing keys, wrong
    tensor sizes) is a :class:`GGUFError` naming the file and what is wrong."""
    try:
        return _read_gguf(path)
    except GGUFError:
        raise
    except Exception as e:  # the gguf reader's and numpy's own errors on a damaged file
        raise GGUFError(f"{path} is not a readable GGUF file ({type(e).__name__}: "
                        f"{str(e)[:120]})") from None


def _required(reader, path: Path, key: str):
    value = _field(reader, key)
    if value is None:
        raise GGUFError(f"{path} lacks the GGUF key {key!r}")
    return value


def _read_gguf(path: Path) -> tuple[ModelConfig, dict[str, Tensor], dict]:
    reader = GGUFFile(path)
    arch = _required(reader, path, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: architecture {arch!r} is not supported "
                         f"({', '.join(ARCHITECTURES)})")

    def key(name: str) -> str:
        return f"{arch}.{name}"

    n_heads = int(_required(reader, path, key("attention.head_count")))
    n_kv = int(_field(reader, key("attention.head_count_kv"), n_heads))
    blocks = _GEMMA3_BLOCK if arch == "gemma3" else _BLOCK
    state: dict[str, Tensor] = {}
    for t in reader.tensors:
        w = torch.from_numpy(reader.read(t))
        if arch == "gemma3" and t.name.endswith("norm.weight"):
            w -= 1  # Hugging Face's Gemma norms multiply by 1 + weight
        if t.name in _TOP:
            state[_TOP[t.name]] = w
            continue
        parts = t.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in blocks:
            raise GGUFError(f"{path} holds a tensor vaswani does not know: {t.name!r}")
        _, block, kind, _ = parts
        if arch == "llama" and kind == "attn_q":
            w = unpermute(w, n_heads)
        elif arch == "llama" and kind == "attn_k":
            w = unpermute(w, n_kv)
        state[f"model.layers.{block}.{blocks[kind]}.weight"] = w
    tokens = _required(reader, path, "tokenizer.ggml.tokens")
    scaling = _field(reader, key("rope.scaling.type"), "none")
    if scaling not in ("none", "", None):
        raise GGUFError(f"{path}: {key('rope.scaling.type')} = {scaling!r} is not supported "
                        "(plain rotary frequencies only)")
    if arch == "gemma3":
        head_dim = int(_required(reader, path, key("attention.key_length")))
        config = gemma3.config_from_hf({
            "model_type": "gemma3_text", "num_attention_heads": n_heads,
            "num_key_value_heads": n_kv, "head_dim": head_dim,
            "query_pre_attn_scalar": head_dim,  # llama.cpp scales by 1 / sqrt(head_dim) too
            "hidden_size": int(_required(reader, path, key("embedding_length"))),
            "intermediate_size": int(_required(reader, path, key("feed_forward_length"))),
            "num_hidden_layers": int(_required(reader, path, key("block_count"))),
            "max_position_embeddings": int(_required(reader, path, key("context_length"))),
            "rms_norm_eps": float(_required(reader, path,
                                            key("attention.layer_norm_rms_epsilon"))),
            "rope_theta": float(_field(reader, key("rope.freq_base"), 1_000_000.0)),
            "rope_local_base_freq": 10_000.0,  # llama.cpp's, for every Gemma 3
            "sliding_window": int(_required(reader, path, key("attention.sliding_window"))),
            "sliding_window_pattern": 6,  # llama.cpp's, for every Gemma 3
            "vocab_size": len(tokens), "tie_word_embeddings": "lm_head.weight" not in state},
            pad_id=int(_field(reader, "tokenizer.ggml.padding_token_id", 0)))
    else:
        config = llama_config(
            vocab_size=int(_field(reader, key("vocab_size"), len(tokens))),
            d_model=int(_required(reader, path, key("embedding_length"))), n_heads=n_heads,
            n_kv_heads=n_kv, d_ff=int(_required(reader, path, key("feed_forward_length"))),
            n_layers=int(_required(reader, path, key("block_count"))),
            max_len=int(_required(reader, path, key("context_length"))),
            rope_base=float(_field(reader, key("rope.freq_base"), 10000.0)),
            norm_eps=float(_required(reader, path, key("attention.layer_norm_rms_epsilon"))),
            tie_embeddings="lm_head.weight" not in state,
            pad_id=int(_field(reader, "tokenizer.ggml.unknown_token_id", 0)))
    tokenizer = {
        "architecture": arch,
        "model": _required(reader, path, "tokenizer.ggml.model"),
        "pre": _field(reader, "tokenizer.ggml.pre"),
        "tokens": tokens, "merges": _field(reader, "tokenizer.ggml.merges", []),
        "scores": _field(reader, "tokenizer.ggml.scores", []),
        "token_type": _field(reader, "tokenizer.ggml.token_type", []),
        "bos": int(_field(reader, "tokenizer.ggml.bos_token_id", 1)),
        "eos": int(_field(reader, "tokenizer.ggml.eos_token_id", 2)),
        "unk": int(_field(reader, "tokenizer.ggml.unknown_token_id", 0)),
        "add_bos": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_space_prefix": bool(_field(reader, "tokenizer.ggml.add_space_prefix", True)),
        "chat_template": _field(reader, "tokenizer.chat_template"),
    }
    return config, state, tokenizer


CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types of special and added tokens


def build_tokenizer(fields: dict):
    """A Hugging Face ``tokenizers`` tokenizer from GGUF tokenizer fields: byte-level BPE
    (``gpt2``: SmolLM2 and most LLaMA-family models since LLaMA 3) or SentencePiece's BPE
    (``llama``: Gemma, LLaMA 1 and 2). ``<bos>`` first where the file says so."""
    from tokenizers import AddedToken, processors

    if fields["model"] == "gpt2":
        hf = _byte_level_bpe(fields)
    elif fields["model"] == "llama":
        hf = _sentencepiece_bpe(fields)
    else:
        raise ValueError(f"tokenizer model {fields['model']!r} is not supported (gpt2 BPE, "
                         "llama SentencePiece)")
    kinds = list(fields["token_type"])
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, kind in zip(fields["tokens"], kinds, strict=False)
                           if kind == CONTROL])
    hf.add_tokens([AddedToken(t, special=False, normalized=False)
                   for t, kind in zip(fields["tokens"], kinds, strict=False)
                   if kind == USER_DEFINED])
    if fields.get("add_bos"):
        bos = fields["tokens"][fields["bos"]]
        hf.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, fields["bos"])])
    return hf


def _byte_level_bpe(fields: dict):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(fields["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in fields["merges"]]
    hf = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if fields["pre"] in ("smollm", "starcoder"):  # digits are split one by one first
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        hf.pre_tokenizer = byte_level
    hf.decoder = decoders.ByteLevel()
    return hf


def _sentencepiece_bpe(fields: dict):
    """SentencePiece's BPE as llama.cpp runs it: spaces are "▁", adjacent pieces merge in
    the order of the merged piece's score, bytes no piece covers fall back to ``<0xNN>``
    tokens. Its merges are derived from the scores (as ``transformers`` derives them)."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    tokens, scores = list(fields["tokens"]), list(fields["scores"])
    vocab = {tok: i for i, tok in enumerate(tokens)}
    kinds = list(fields["token_type"])
    normal = {tok: score for tok, score, kind in zip(tokens, scores, kinds, strict=False)
              if kind == 1}  # llama.cpp's NORMAL pieces: the ones merges produce
    merges = []
    for piece, score in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                merges.append((score, vocab[left], vocab[right], left, right))
    merges.sort(key=lambda m: (-m[0], m[1], m[2]))
    hf = Tokenizer(models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges],
                              unk_token=tokens[fields["unk"]], fuse_unk=True,
                              byte_fallback=True))
    steps = [normalizers.Replace(" ", "▁")]
    if fields.get("add_space_prefix"):
        steps.insert(0, normalizers.Prepend("▁"))
    hf.normalizer = normalizers.Sequence(steps)
    strip = [decoders.Strip(" ", 1, 0)] if fields.get("add_space_prefix") else []
    hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                    decoders.Fuse(), *strip])
    return hf
