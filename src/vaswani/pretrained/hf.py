"""Reading a Hugging Face model folder: config.json, the weights (``model.safetensors``, or
shards listed in ``model.safetensors.index.json``), tokenizer.json with the special tokens
config.json and tokenizer_config.json name, and the chat template. Each problem is an error
that names the file."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
from torch import Tensor

from ..data.tokenizers import PretrainedTokenizer


def read_config(folder: Path) -> dict:
    """config.json as a dict, once the folder is known to hold a tokenizer too."""
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder (a Hugging Face model is a folder with "
                         "config.json, *.safetensors and tokenizer.json)")
    for name in ("config.json", "tokenizer.json"):
        if not (folder / name).exists():
            raise FileNotFoundError(f"{folder} has no {name} (a Hugging Face model folder "
                                    "needs config.json, *.safetensors and tokenizer.json)")
    return _json(folder / "config.json")


# config.json's numbers, as transformers' config classes read them (null: the class's default)
WHOLE = ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
         "intermediate_size", "num_hidden_layers", "max_position_embeddings", "head_dim",
         "n_embd", "n_head", "n_layer", "n_positions", "n_inner", "sliding_window_pattern")
COUNTS = ("type_vocab_size", "sliding_window")  # may be 0
POSITIVE = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta",
            "rope_local_base_freq", "query_pre_attn_scalar")
FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window")
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")


def check_config(hf: dict, path: Path) -> None:
    """Refuse, naming the field, a config.json whose sizes are not whole numbers >= 1 (0 for
    counts), whose epsilons and bases are not finite numbers > 0, whose flags are not
    true/false, whose token ids are not ids of its vocabulary, or whose head counts
    contradict each other: before anything is built from it."""
    def number(value) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    for key in WHOLE + COUNTS:
        value, least = hf.get(key), 0 if key in COUNTS else 1
        if value is not None and (not number(value) or value != int(value) or value < least):
            raise ValueError(f"{path}: {key} ({value!r}) must be a whole number >= {least}")
    for key in POSITIVE:
        value = hf.get(key)
        if value is not None and not (number(value) and math.isfinite(value) and value > 0):
            raise ValueError(f"{path}: {key} ({value!r}) must be a finite number > 0")
    for key in FLAGS:
        if hf.get(key) is not None and not isinstance(hf[key], bool):
            raise ValueError(f"{path}: {key} ({hf[key]!r}) must be true or false")
    vocab = hf.get("vocab_size")
    for key in TOKEN_IDS:
        ids = hf.get(key)
        for token in ids if isinstance(ids, list) else [] if ids is None else [ids]:
            if not number(token) or token != int(token) or not 0 <= token < (vocab or 2**63):
                raise ValueError(f"{path}: {key} ({ids!r}) must be a token id in [0, "
                                 f"vocab_size ({vocab}))")
    heads, kv = hf.get("num_attention_heads"), hf.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise ValueError(f"{path}: num_attention_heads ({heads}) must be a multiple of "
                         f"num_key_value_heads ({kv})")


EMBEDDINGS = ("model.embed_tokens.weight", "language_model.model.embed_tokens.weight",
              "transformer.wte.weight", "wte.weight", "embeddings.word_embeddings.weight",
              "bert.embeddings.word_embeddings.weight")


def check_against_weights(hf: dict, folder: Path) -> None:
    """The config's vocabulary and width against the token table the weights hold, read from
    the files' headers only: a vocab_size of 10**12 over a table of 300 rows is refused
    before a tokenizer or a model is sized by it."""
    from safetensors import safe_open

    for shard in _shards(folder):
        try:
            with safe_open(str(folder / shard), "pt") as f:
                names = set(f.keys())
                name = next((n for n in EMBEDDINGS if n in names), None)
                shape = None if name is None else tuple(f.get_slice(name).get_shape())
        except Exception as e:  # safetensors' own errors: missing, truncated, garbled
            raise ValueError(f"{folder / shard}: unreadable weights ({type(e).__name__}: "
                             f"{str(e)[:120]})") from None
        if shape is None:
            continue
        for key, size in (("vocab_size", shape[0]), ("hidden_size", shape[-1]),
                          ("n_embd", shape[-1])):
            if hf.get(key) is not None and hf[key] != size:
                raise ValueError(f"{folder / 'config.json'}: {key} is {hf[key]}, but the "
                                 f"weights' {name} has shape {shape}: the config does not "
                                 "belong to these weights")
        return


def read_weights(folder: Path) -> dict[str, Tensor]:
    """Every tensor of the folder's weights by name (one file, or the shards its index
    lists)."""
    from safetensors.torch import load_file

    weights: dict[str, Tensor] = {}
    for shard in _shards(folder):
        try:
            weights.update(load_file(str(folder / shard)))
        except Exception as e:  # safetensors' own errors: missing, truncated, garbled
            raise ValueError(f"{folder / shard}: unreadable weights ({type(e).__name__}: "
                             f"{str(e)[:120]})") from None
    return weights


def _shards(folder: Path) -> list[str]:
    """The folder's weight files: one, or the shards its index lists."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return sorted(set(_json(index).get("weight_map", {}).values()))
    if (folder / "model.safetensors").exists():
        return ["model.safetensors"]
    raise FileNotFoundError(f"{folder} has no model.safetensors nor "
                            "model.safetensors.index.json (PyTorch .bin weights are not "
                            "read: they are pickles)")


def tied_as_read(config, weights: dict[str, Tensor]):
    """``config`` with its head tied as transformers ties it on these weights: a config that
    ties the head to the token table while the weights hold an ``lm_head.weight`` of other
    values is untied (transformers then uses the file's head, and says so); one of equal
    values is dropped (a tied head saved twice)."""
    head = weights.get("lm_head.weight")
    if not config.tie_embeddings or head is None:
        return config
    table = next((weights[n] for n in EMBEDDINGS if n in weights), None)
    if table is not None and table.shape == head.shape and torch.equal(table, head):
        del weights["lm_head.weight"]
        return config
    print("vaswani: config.json ties the output head to the token table, but the weights "
          "hold an lm_head.weight of other values; it is used, untied, as transformers does",
          file=sys.stderr, flush=True)
    return config.replace(tie_embeddings=False)


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    return value.get("content") if isinstance(value, dict) else value


def read_tokenizer(folder: Path, config: dict) -> tuple[PretrainedTokenizer, str | None]:
    """The folder's tokenizer with its special ids, and its chat template (if any).

    bos and eos come from config.json (eos: the first of a list), else from
    tokenizer_config.json; padding is the pad token if there is one, else eos (a decoder pads
    nothing it reads); unknown is the model's own, else eos. A model whose embedding table is
    larger than its tokenizer (Qwen2 rounds 151,665 tokens up to 151,936 rows) gets the
    missing ids as special tokens (``<unused:ID>``) that decoding skips, so that every id the
    model can produce has a token."""
    from tokenizers import AddedToken, Tokenizer

    try:
        hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as e:  # tokenizers' own errors
        raise ValueError(f"{folder / 'tokenizer.json'} is not a readable tokenizer "
                         f"({str(e)[:120]})") from None
    rows = config.get("vocab_size")
    if isinstance(rows, int) and hf.get_vocab_size() > rows:
        raise ValueError(f"{folder / 'tokenizer.json'} has {hf.get_vocab_size()} tokens but "
                         f"config.json's vocab_size is {rows}: the tokenizer does not belong "
                         "to this model")
    if isinstance(rows, int) and hf.get_vocab_size() < rows:
        hf.add_special_tokens([AddedToken(f"<unused:{i}>", special=True)
                               for i in range(hf.get_vocab_size(), rows)])
    extra = _json(folder / "tokenizer_config.json") \
        if (folder / "tokenizer_config.json").exists() else {}

    def id_of(role: str) -> int | None:
        given = config.get(f"{role}_token_id")
        if isinstance(given, list):
            given = given[0] if given else None
        if given is not None:
            return int(given)
        text = _token_text(extra.get(f"{role}_token"))
        return None if text is None else hf.token_to_id(text)

    eos = id_of("eos")
    if eos is None:
        raise ValueError(f"{folder}: no end-of-sequence token (eos_token_id in config.json "
                         "or eos_token in tokenizer_config.json)")
    bos = id_of("bos")
    pad = id_of("pad")
    unk = getattr(hf.model, "unk_token", None)
    unk = hf.token_to_id(unk) if unk else None
    ids = {"pad": eos if pad is None else pad, "bos": eos if bos is None else bos, "eos": eos,
           "unk": eos if unk is None else unk}
    template = extra.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t.get("template") for t in template if t.get("name") == "default"),
                        None)
    if template is None and (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    return PretrainedTokenizer(hf, ids), template
