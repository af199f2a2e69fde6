"""GGUF files (llama.cpp's format) -> Hugging Face-named fp32 weights, a ModelConfig and a
tokenizer (byte-level BPE, or SentencePiece's BPE), for every architecture whose file in
vaswani/architectures/ says how llama.cpp's converter writes it (its ``GGUF`` record: LLaMA,
which is how Mistral is written too, Qwen2, Gemma 3, ...).

The file is read by :mod:`.gguf_file`; quantized tensors (Q4_1, Q4_K, Q8_0, ...) are
dequantized with PyPI ``gguf``. Where the converter permuted the rows of q and k so that
rotary pairs are interleaved (LLaMA's), the permutation is undone here: vaswani (like
Hugging Face) rotates halves. Gemma's norms are stored with their 1 added; Hugging Face's
names hold them without it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from ..architectures import Unsupported, for_gguf
from ..config import ModelConfig
from .gguf_file import GGUFFile

# GGUF tensor names outside the blocks -> Hugging Face's (a block's are the architecture's)
_TOP = {"token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_REFUSED = {"rope_freqs.weight": "Llama 3.1's rescaled rotary frequencies are read from "
                                 "Hugging Face folders only (vaswani import hf)"}


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
    """A GGUF file that cannot be read as a checkpoint vaswani runs; the message names the
    file."""


def read_gguf(path: Path) -> tuple[ModelConfig, dict[str, Tensor], dict]:
    """(config, Hugging Face-named fp32 state dict, fields: the architecture, the settings
    under config.json's names, and the
    tokenizer's) of a GGUF file of an architecture vaswani reads.
    A damaged or incomplete file (random bytes, a truncated download, missing keys, wrong
    tensor sizes) is a :class:`GGUFError` naming the file and what is wrong."""
    try:
        return _read_gguf(path)
    except GGUFError:
        raise
    except Exception as e:  # the gguf reader's and numpy's own errors on a damaged file
        raise GGUFError(f"{path} is not a readable GGUF file ({type(e).__name__}: "
                        f"{str(e)[:120]})") from None


_REQUIRED = object()  # read()'s default: the key must be in the file


def _required(reader, path: Path, key: str):
    value = _field(reader, key)
    if value is None:
        raise GGUFError(f"{path} lacks the GGUF key {key!r}")
    return value


def _read_gguf(path: Path) -> tuple[ModelConfig, dict[str, Tensor], dict]:
    reader = GGUFFile(path)
    arch = _required(reader, path, "general.architecture")
    architecture = for_gguf(arch, str(path))
    gguf = architecture.gguf

    def key(name: str) -> str:
        return f"{arch}.{name}"

    def read(name: str, default=_REQUIRED):
        return _required(reader, path, name) if default is _REQUIRED else \
            _field(reader, name, default)

    n_heads = int(_required(reader, path, key("attention.head_count")))
    n_kv = int(_field(reader, key("attention.head_count_kv"), n_heads))
    state: dict[str, Tensor] = {}
    for t in reader.tensors:
        if t.name in _REFUSED:
            raise GGUFError(f"{path} holds {t.name!r}: {_REFUSED[t.name]}")
        parts = t.name.split(".")
        if t.name not in _TOP and not (
                len(parts) == 4 and parts[0] == "blk" and parts[2] in gguf.blocks
                and (parts[3] == "weight" or (parts[3] == "bias" and parts[2] in gguf.biased))):
            raise GGUFError(f"{path} holds a tensor vaswani does not know: {t.name!r}")
        w = torch.from_numpy(reader.read(t))
        if gguf.norms_plus_one and t.name.endswith("norm.weight"):
            w -= 1  # Hugging Face's Gemma norms multiply by 1 + weight
        if t.name in _TOP:
            state[_TOP[t.name]] = w
            continue
        _, block, kind, suffix = parts
        if gguf.permuted and kind in ("attn_q", "attn_k"):  # llama.cpp's rotary pairs
            w = unpermute(w, n_heads if kind == "attn_q" else n_kv)
        state[f"model.layers.{block}.{gguf.blocks[kind]}.{suffix}"] = w
    tokens = _required(reader, path, "tokenizer.ggml.tokens")
    scaling = _field(reader, key("rope.scaling.type"), "none")
    if scaling not in ("none", "", None):
        raise GGUFError(f"{path}: {key('rope.scaling.type')} = {scaling!r} is not supported "
                        "(plain rotary frequencies only)")
    hf = {  # the file's settings under config.json's names
        "model_type": arch, "num_attention_heads": n_heads, "num_key_value_heads": n_kv,
        "hidden_size": int(_required(reader, path, key("embedding_length"))),
        "intermediate_size": int(_required(reader, path, key("feed_forward_length"))),
        "num_hidden_layers": int(_required(reader, path, key("block_count"))),
        "max_position_embeddings": int(_required(reader, path, key("context_length"))),
        "rms_norm_eps": float(_required(reader, path, key("attention.layer_norm_rms_epsilon"))),
        "tie_word_embeddings": "lm_head.weight" not in state}
    rotated = _field(reader, key("rope.dimension_count"))
    head_dim = _field(reader, key("attention.key_length"), hf["hidden_size"] // n_heads)
    if rotated is not None and int(rotated) != int(head_dim):
        raise GGUFError(f"{path}: {key('rope.dimension_count')} = {rotated} rotates part of "
                        f"each {head_dim}-wide head; vaswani rotates whole heads")
    hf["head_dim"] = int(head_dim)
    settings = {**hf, **gguf.settings(read)}
    try:
        config = architecture.config_from_hf(settings)
    except Unsupported as e:
        raise GGUFError(f"{path}: {str(e).removeprefix('config.json: ')}") from None
    config = config.replace(architecture=architecture.name)
    tokenizer = {
        "architecture": arch, "settings": settings,
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


# llama.cpp's names of the ways a byte-level vocabulary splits text before merging: the
# regular expression of each (None: GPT-2's own), and whether digits go one by one first
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {"default": (None, False), "gpt2": (None, False),
                  "smollm": (None, True), "starcoder": (None, True),
                  "llama-bpe": (_LLAMA3_SPLIT, False), "llama3": (_LLAMA3_SPLIT, False),
                  "llama-v3": (_LLAMA3_SPLIT, False), "smaug-bpe": (_LLAMA3_SPLIT, False),
                  "qwen2": (_QWEN2_SPLIT, False), "deepseek-r1-qwen": (_QWEN2_SPLIT, False)}


def _byte_level_bpe(fields: dict):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = fields["pre"] or "default"
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"tokenizer.ggml.pre = {pre!r} is not supported (vaswani splits text "
                         f"as {', '.join(PRE_TOKENIZERS)} do)")
    split, digits = PRE_TOKENIZERS[pre]
    vocab = {tok: i for i, tok in enumerate(fields["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in fields["merges"]]
    hf = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if split is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(split), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    hf.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
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
