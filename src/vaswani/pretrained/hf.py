"""Reading a Hugging Face model folder: config.json, the weights (``model.safetensors``, or
shards listed in ``model.safetensors.index.json``), tokenizer.json with the special tokens
config.json and tokenizer_config.json name, and the chat template. Each problem is an error
that names the file."""

from __future__ import annotations

import json
from pathlib import Path

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


def read_weights(folder: Path) -> dict[str, Tensor]:
    """Every tensor of the folder's weights by name (one file, or the shards its index
    lists)."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(_json(index).get("weight_map", {}).values()))
    elif (folder / "model.safetensors").exists():
        shards = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{folder} has no model.safetensors nor "
                                "model.safetensors.index.json (PyTorch .bin weights are not "
                                "read: they are pickles)")
    weights: dict[str, Tensor] = {}
    for shard in shards:
        try:
            weights.update(load_file(str(folder / shard)))
        except Exception as e:  # safetensors' own errors: missing, truncated, garbled
            raise ValueError(f"{folder / shard}: unreadable weights ({type(e).__name__}: "
                             f"{str(e)[:120]})") from None
    return weights


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
