"""GGUF files (llama.cpp's format) of LLaMA-family models -> Hugging Face-named fp32 weights,
a ModelConfig and a byte-level BPE tokenizer.

Quantized tensors (Q4_1, Q8_0, ...) are dequantized with PyPI ``gguf``. llama.cpp's converter
permutes the rows of the q and k projections so that rotary pairs are interleaved; vaswani
(like Hugging Face) rotates halves, so the permutation is undone here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..config import ModelConfig
from .llama import llama_config

# GGUF tensor name (per block "blk.N.") -> Hugging Face LlamaForCausalLM name
_TOP = {"token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
          "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def _reader(path: Path):
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - gguf is a dependency
        raise ImportError("reading GGUF files needs the 'gguf' package: pip install gguf") from e
    return gguf, gguf.GGUFReader(str(path))


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def unpermute(w: Tensor, n_heads: int) -> Tensor:
    """Undo llama.cpp's q/k row permutation: within each head, rows were reordered from
    [first half; second half] to interleaved pairs."""
    rows = w.shape[0]
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


class GGUFError(ValueError):
    """A GGUF file that cannot be read as a LLaMA checkpoint; the message names the file."""


def read_gguf(path: Path) -> tuple[ModelConfig, dict[str, Tensor], dict]:
    """(config, Hugging Face-named fp32 state dict, tokenizer fields) of a LLaMA GGUF file.
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
    gguf, reader = _reader(path)
    arch = _required(reader, path, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r} is not supported (llama)")
    n_heads = int(_required(reader, path, "llama.attention.head_count"))
    n_kv = int(_field(reader, "llama.attention.head_count_kv", n_heads))
    state: dict[str, Tensor] = {}
    for t in reader.tensors:
        array = gguf.quants.dequantize(t.data, t.tensor_type)
        w = torch.from_numpy(np.array(array, dtype=np.float32))  # a writable copy
        if t.name in _TOP:
            state[_TOP[t.name]] = w
            continue
        parts = t.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _BLOCK:
            raise GGUFError(f"{path} holds a tensor vaswani does not know: {t.name!r}")
        _, block, kind, _ = parts
        if kind == "attn_q":
            w = unpermute(w, n_heads)
        elif kind == "attn_k":
            w = unpermute(w, n_kv)
        state[f"model.layers.{block}.{_BLOCK[kind]}.weight"] = w
    tokens = _required(reader, path, "tokenizer.ggml.tokens")
    config = llama_config(
        vocab_size=int(_field(reader, "llama.vocab_size", len(tokens))),
        d_model=int(_required(reader, path, "llama.embedding_length")), n_heads=n_heads,
        n_kv_heads=n_kv, d_ff=int(_required(reader, path, "llama.feed_forward_length")),
        n_layers=int(_required(reader, path, "llama.block_count")),
        max_len=int(_required(reader, path, "llama.context_length")),
        rope_base=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        norm_eps=float(_required(reader, path, "llama.attention.layer_norm_rms_epsilon")),
        tie_embeddings="lm_head.weight" not in state,
        pad_id=int(_field(reader, "tokenizer.ggml.unknown_token_id", 0)))
    tokenizer = {
        "model": _required(reader, path, "tokenizer.ggml.model"),
        "pre": _field(reader, "tokenizer.ggml.pre"),
        "tokens": tokens, "merges": _field(reader, "tokenizer.ggml.merges", []),
        "token_type": _field(reader, "tokenizer.ggml.token_type", []),
        "bos": int(_field(reader, "tokenizer.ggml.bos_token_id", 1)),
        "eos": int(_field(reader, "tokenizer.ggml.eos_token_id", 2)),
        "unk": int(_field(reader, "tokenizer.ggml.unknown_token_id", 0)),
        "chat_template": _field(reader, "tokenizer.chat_template"),
    }
    return config, state, tokenizer


CONTROL = 3  # llama.cpp token type of special (control) tokens


def build_tokenizer(fields: dict):
    """A Hugging Face byte-level BPE tokenizer from GGUF tokenizer fields (GPT-2 style, as
    used by SmolLM2 and most LLaMA-family models since LLaMA 3)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if fields["model"] != "gpt2":
        raise ValueError(f"tokenizer model {fields['model']!r} is not supported (gpt2 BPE)")
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
    specials = [tok for tok, kind in zip(fields["tokens"], fields["token_type"], strict=False)
                if kind == CONTROL]
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return hf
