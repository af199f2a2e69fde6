"""Tiny pretrained checkpoints written by the tests themselves: a BERT folder (Hugging Face
layout) and a LLaMA GGUF file, both with random weights, for import faults without network."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

LETTERS = list("abcdefghijklmnopqrstuvwxyz ")


def bert_folder(folder: Path) -> Path:
    """config.json, model.safetensors and tokenizer.json of a 1-layer, d 16 BERT."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + LETTERS[:-1])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=32)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


CHATML = ("{% for m in messages %}{{ '<s>' + m['role'] + ':' + m['content'] + '</s>' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<s>assistant:' }}{% endif %}")


def llama_gguf(path: Path, *, skip: tuple[str, ...] = (), wrong_shape: str = "",
               chat_template: str | None = None, metadata: dict | None = None) -> Path:
    """A 1-layer LLaMA (d 16, 2 heads, 1 k/v head, vocabulary 30) as GGUF, fp32. ``skip``
    leaves out metadata keys; ``wrong_shape`` names a tensor written with a wrong shape;
    ``chat_template`` is stored as the checkpoint's (tokenizer.chat_template); ``metadata``
    gives other values to some keys (the tensors keep their shapes)."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>"] + [f"{c}" for c in LETTERS]
    rng = np.random.default_rng(0)
    d, ff, v = 16, 32, len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    m = {"context_length": 64, "embedding_length": d, "block_count": 1,
         "feed_forward_length": ff, "head_count": 2, "head_count_kv": 1, **(metadata or {})}
    keys = {
        "context_length": lambda: w.add_context_length(m["context_length"]),
        "embedding_length": lambda: w.add_embedding_length(m["embedding_length"]),
        "block_count": lambda: w.add_block_count(m["block_count"]),
        "feed_forward_length": lambda: w.add_feed_forward_length(m["feed_forward_length"]),
        "head_count": lambda: w.add_head_count(m["head_count"]),
        "head_count_kv": lambda: w.add_head_count_kv(m["head_count_kv"]),
        "rms_eps": lambda: w.add_layer_norm_rms_eps(1e-5),
        "tokenizer": lambda: w.add_tokenizer_model("gpt2"),
    }
    for name, add in keys.items():
        if name not in skip:
            add()
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * len(LETTERS))
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if chat_template:
        w.add_chat_template(chat_template)
    shapes = {"token_embd.weight": (v, d), "output_norm.weight": (d,),
              "blk.0.attn_q.weight": (d, d), "blk.0.attn_k.weight": (d // 2, d),
              "blk.0.attn_v.weight": (d // 2, d), "blk.0.attn_output.weight": (d, d),
              "blk.0.ffn_gate.weight": (ff, d), "blk.0.ffn_up.weight": (ff, d),
              "blk.0.ffn_down.weight": (d, ff), "blk.0.attn_norm.weight": (d,),
              "blk.0.ffn_norm.weight": (d,)}
    for name, shape in shapes.items():
        if name == wrong_shape:
            shape = (shape[0] + 1, *shape[1:])
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32) * 0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
