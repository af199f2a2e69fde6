"""CTranslate2: a translator as a ``TransformerSpec``, a language model as a
``TransformerDecoderModelSpec``, built with CTranslate2's spec API the way its own OpenNMT-py
and Marian converters build theirs (``from_config`` with the architecture's options, then every
weight set by name), then validated, optionally quantized to int8, and saved.

The mapping, vaswani -> CTranslate2 (per layer):

    self_attn.in_proj (q;k;v stacked)     self_attention.linear[0] (fused q, k, v)
    self_attn.out_proj                    self_attention.linear[1]
    cross_attn.in_proj (q;k;v)            attention.linear[0] (q) and linear[1] (k;v)
    cross_attn.out_proj                   attention.linear[2]
    {attn,self,cross,ff}_block.norm       self_attention/attention/ffn .layer_norm
    feed_forward.linear1 / linear2        ffn.linear_0 / linear_1 (SwiGLU: gate and up split
                                          into linear_0 and linear_0_noact)
    encoder.norm / decoder.norm           encoder/decoder .layer_norm (pre-LN's final norm)

Positions: vaswani's own sinusoidal table (or the learned one) is written as the position
encodings, so both engines add the same vectors; RoPE maps to CTranslate2's rotary embeddings
(rotate-half layout: ``rotary_interleave=False``). The vocabulary is the tokenizer's token
strings; inference/ct2.py passes token strings in and maps them back to ids, so vaswani's
tokenizer stays the one that splits and joins text.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config.family import family
from ..data.tokenizers import token_strings
from . import refuse

ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "gelu_tanh": "GELUTanh", "swiglu": "SWISH"}


def check(config) -> None:
    """Refuse the options CTranslate2 has no exact counterpart for."""
    c = config
    if not family(c.arch).decoder:
        raise refuse("ct2", "arch", c.arch, "CTranslate2 export serves translators "
                     "(encoder-decoder) and language models (decoder)")
    if c.type_vocab_size:
        raise refuse("ct2", "type_vocab_size", c.type_vocab_size, "no token types")
    if c.embed_norm:
        raise refuse("ct2", "embed_norm", c.embed_norm, "no norm after the embeddings here")
    if c.positional == "none":
        raise refuse("ct2", "positional", c.positional, "sinusoidal, learned or rope")
    if family(c.arch).cross and c.positional == "rope":
        raise refuse("ct2", "positional", c.positional, "a translator takes sinusoidal or "
                     "learned positions")
    if c.qkv_bias is not None and c.qkv_bias != c.bias:
        raise refuse("ct2", "qkv_bias", c.qkv_bias, "biases on every projection or none")
    if c.rope.scaling != "none":
        raise refuse("ct2", "rope.scaling", c.rope.scaling, "plain rotary frequencies")
    if c.activation not in ACTIVATIONS:
        raise refuse("ct2", "activation", c.activation, ", ".join(ACTIVATIONS))
    for option, value in (("qk_norm", False), ("post_norms", False), ("window.size", 0),
                          ("rope.nope_every", 0), ("experts.count", 0),
                          ("head_dim", c.d_model // c.n_heads)):
        if c.setting(option) != value:
            raise refuse("ct2", option, c.setting(option), f"{value!r} only")
    if family(c.arch).cross and c.n_kv_heads not in (c.n_heads, 1):
        raise refuse("ct2", "n_kv_heads", c.n_kv_heads, "a translator takes n_heads or 1")


def _np(t: torch.Tensor):
    return t.detach().float().contiguous().numpy()


def _linear(spec, sd: dict, name: str, rows: slice | None = None) -> None:
    weight = sd[f"{name}.weight"]
    spec.weight = _np(weight if rows is None else weight[rows])
    if f"{name}.bias" in sd:
        bias = sd[f"{name}.bias"]
        spec.bias = _np(bias if rows is None else bias[rows])


def _norm(spec, sd: dict, name: str, d_model: int) -> None:
    spec.gamma = _np(sd[f"{name}.weight"])
    if hasattr(spec, "beta"):  # a LayerNorm; vaswani's without bias subtracts nothing more
        spec.beta = _np(sd.get(f"{name}.bias", torch.zeros(d_model)))


def _self_attention(spec, sd: dict, name: str) -> None:
    _linear(spec.linear[0], sd, f"{name}.in_proj")
    _linear(spec.linear[1], sd, f"{name}.out_proj")


def _cross_attention(spec, sd: dict, name: str, d_model: int) -> None:
    _linear(spec.linear[0], sd, f"{name}.in_proj", slice(0, d_model))
    _linear(spec.linear[1], sd, f"{name}.in_proj", slice(d_model, None))
    _linear(spec.linear[2], sd, f"{name}.out_proj")


def _feed_forward(spec, sd: dict, name: str, c) -> None:
    if c.activation == "swiglu":  # vaswani stacks [gate; up] in linear1
        _linear(spec.linear_0, sd, f"{name}.linear1", slice(0, c.d_ff))
        _linear(spec.linear_0_noact, sd, f"{name}.linear1", slice(c.d_ff, None))
    else:
        _linear(spec.linear_0, sd, f"{name}.linear1")
    _linear(spec.linear_1, sd, f"{name}.linear2")


def _embeddings(stack_spec, embed, c) -> None:
    embeddings = stack_spec.embeddings  # the encoder has a list (one per source feature)
    (embeddings[0] if isinstance(embeddings, list) else embeddings).weight = _np(
        embed.token.weight)
    stack_spec.scale_embeddings = bool(c.scale_embeddings)
    if c.positional in ("sinusoidal", "learned"):
        table = embed.position.pe if c.positional == "sinusoidal" else embed.position.weight
        stack_spec.position_encodings.encodings = _np(table[: c.max_len])


def _layers(stack_spec, sd: dict, prefix: str, c, *, cross: bool) -> None:
    for i, layer in enumerate(stack_spec.layer):
        p = f"{prefix}.layers.{i}"
        attn_norm = f"{p}.self_block.norm" if f"{p}.self_block.norm.weight" in sd else \
            f"{p}.attn_block.norm"
        _self_attention(layer.self_attention, sd, f"{p}.self_attn")
        _norm(layer.self_attention.layer_norm, sd, attn_norm, c.d_model)
        if cross:
            _cross_attention(layer.attention, sd, f"{p}.cross_attn", c.d_model)
            _norm(layer.attention.layer_norm, sd, f"{p}.cross_block.norm", c.d_model)
        _feed_forward(layer.ffn, sd, f"{p}.feed_forward", c)
        _norm(layer.ffn.layer_norm, sd, f"{p}.ff_block.norm", c.d_model)
    if c.norm_first:
        _norm(stack_spec.layer_norm, sd, f"{prefix}.norm", c.d_model)


def vocabulary(tokenizer) -> list[str]:
    """Every id's token string (CTranslate2 names tokens by string), refused if two ids share
    one."""
    tokens = token_strings(tokenizer)
    if len(set(tokens)) != len(tokens):
        raise refuse("ct2", "tokenizer", "with repeated token strings", "CTranslate2 names "
                     "every token by a unique string")
    return tokens


def build_spec(run):
    """The CTranslate2 model spec of a loaded run, every weight set."""
    from ctranslate2.specs import common_spec, transformer_spec

    c = run.config.model
    check(c)
    model = run.model
    sd = model.state_dict()
    activation = getattr(common_spec.Activation, ACTIVATIONS[c.activation])
    glu = c.activation == "swiglu"
    rms = c.norm == "rmsnorm"
    if family(c.arch).cross:
        spec = transformer_spec.TransformerSpec.from_config(
            (c.n_encoder_layers, c.n_decoder_layers), c.n_heads, pre_norm=c.norm_first,
            activation=activation, ffn_glu=glu, rms_norm=rms,
            multi_query_attention=c.n_kv_heads == 1 and c.n_heads > 1)
        _embeddings(spec.encoder, model.src_embed, c)
        _embeddings(spec.decoder, model.tgt_embed, c)
        _layers(spec.encoder, sd, "encoder", c, cross=False)
        _layers(spec.decoder, sd, "decoder", c, cross=True)
        _linear(spec.decoder.projection, sd, "output_proj")
        source, target = run.source_tokenizer, run.target_tokenizer
        spec.register_source_vocabulary(vocabulary(source))
        spec.register_target_vocabulary(vocabulary(target))
        specials = target
    else:
        rope = c.positional == "rope"
        spec = transformer_spec.TransformerDecoderModelSpec.from_config(
            c.n_decoder_layers, c.n_heads, pre_norm=c.norm_first, activation=activation,
            ffn_glu=glu, rms_norm=rms, rotary_dim=0 if rope else None, rotary_interleave=False,
            rotary_base=c.rope.base,
            num_heads_kv=None if c.n_kv_heads == c.n_heads else c.n_kv_heads)
        _embeddings(spec.decoder, model.embed, c)
        _layers(spec.decoder, sd, "decoder", c, cross=False)
        _linear(spec.decoder.projection, sd, "output_proj")
        spec.register_vocabulary(vocabulary(run.source_tokenizer))
        specials = run.source_tokenizer
    spec.config.layer_norm_epsilon = c.norm_eps
    names = vocabulary(specials)
    spec.config.unk_token = names[specials.unk_id]
    spec.config.bos_token = names[specials.bos_id]
    spec.config.eos_token = names[specials.eos_id]
    if family(c.arch).cross:
        spec.config.decoder_start_token = names[specials.bos_id]
        # vaswani's encoder reads every source with <eos> at its end: CTranslate2 adds it too,
        # so translate_batch on plain tokens reproduces vaswani
        if vocabulary(run.source_tokenizer)[run.source_tokenizer.eos_id] != names[specials.eos_id]:
            raise refuse("ct2", "tokenizer", "with different <eos> strings for source and "
                         "target", "one eos_token names both")
        spec.config.add_source_eos = True
    return spec


def write(run, out: Path, *, quantize: str | None = None) -> None:
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise ImportError("the ct2 format needs CTranslate2: pip install 'vaswani[export]'") \
            from None
    spec = build_spec(run)
    spec.validate()
    spec.optimize(quantization=quantize or "float32")
    out.mkdir(parents=True)
    spec.save(str(out))
    (out / "README.md").write_text(usage(run))


def usage(run) -> str:
    """The export's README: how CTranslate2's own API reproduces vaswani with it."""
    c, d = run.config.model, run.config.decode
    out_tok = run.target_tokenizer or run.source_tokenizer
    names = token_strings(out_tok)
    never = [[names[out_tok.pad_id]], [names[out_tok.bos_id]]]
    tokens = ("the names in this folder's vocabulary files, as the run's tokenizer (kept in "
              "`vaswani/tokenizer/`) splits the text: a character tokenizer's are the characters")
    if family(c.arch).cross:
        return f"""# CTranslate2 translator exported by vaswani

```python
import ctranslate2
translator = ctranslate2.Translator("THIS_FOLDER")
results = translator.translate_batch([source_tokens], beam_size={d.beam},
                                     min_decoding_length=0,
                                     max_decoding_length={c.max_len - 1},
                                     suppress_sequences={never})
```

- `source_tokens`: the source's token strings from the run's tokenizer, {tokens}, without
  `<bos>` or `<eos>`: `config.json` says `add_source_eos: true`, so CTranslate2 appends `<eos>`
  as vaswani's encoder expects. At most {c.max_len - 1} tokens (the model's `max_len` is
  {c.max_len}, the `<eos>` included).
- `max_decoding_length`: at most {c.max_len - 1}. The model has {c.max_len} positions; with
  CTranslate2's default (256) a long output fails with "No position encodings are defined for
  positions >= {c.max_len}". vaswani's own cap, per sentence, is
  `min(int({d.max_len_a} * (len(source_tokens) + 1) + {d.max_len_b}), {c.max_len - 1})` (the
  `+ 1` is the `<eos>`): translate with it to get vaswani's translations token for token.
- `min_decoding_length=0`: CTranslate2's default (1) never lets a translation be empty;
  vaswani's does, when `<eos>` is the likeliest first token.
- `suppress_sequences`: vaswani never outputs its padding or start token; CTranslate2 would.
- Scores with `length_penalty=0` are vaswani's log-probabilities; vaswani's length penalty is
  GNMT's, CTranslate2's is `length ** length_penalty`.
- From vaswani: `vaswani translate THIS_FOLDER --engine ct2` (the run's config and tokenizer
  are in `vaswani/`).
"""
    return f"""# CTranslate2 language model exported by vaswani

```python
import ctranslate2
generator = ctranslate2.Generator("THIS_FOLDER")
results = generator.generate_batch([prompt_tokens], max_length=N,
                                   include_prompt_in_result=False,
                                   suppress_sequences={never})
```

- `prompt_tokens`: the prompt's token strings from the run's tokenizer, {tokens}, as vaswani
  reads a prompt: no `<bos>` (an empty prompt is `["<bos>"]`), no `<eos>`.
- `max_length`: the prompt's tokens and the new ones together may not pass the model's
  {c.max_len} positions (beyond them CTranslate2 fails with "No position encodings are defined
  for positions >= {c.max_len}"; vaswani slides its window instead).
- `suppress_sequences`: vaswani never outputs its padding or start token; CTranslate2 would.
- From vaswani: `vaswani generate THIS_FOLDER --engine ct2`.
"""
