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
strings; :class:`Engine` passes token strings in and maps them back to ids, so vaswani's
tokenizer stays the one that splits and joins text.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import refuse

ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "swiglu": "SWISH"}


def check(config) -> None:
    """Refuse the options CTranslate2 has no exact counterpart for."""
    c = config
    if c.arch == "encoder":
        raise refuse("ct2", "arch", c.arch, "CTranslate2 export serves translators "
                     "(encoder-decoder) and language models (decoder)")
    if c.type_vocab_size:
        raise refuse("ct2", "type_vocab_size", c.type_vocab_size, "no token types")
    if c.embed_norm:
        raise refuse("ct2", "embed_norm", c.embed_norm, "no norm after the embeddings here")
    if c.positional == "none":
        raise refuse("ct2", "positional", c.positional, "sinusoidal, learned or rope")
    if c.arch == "encoder-decoder" and c.positional == "rope":
        raise refuse("ct2", "positional", c.positional, "a translator takes sinusoidal or "
                     "learned positions")
    if c.arch == "encoder-decoder" and c.n_kv_heads not in (c.n_heads, 1):
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
        table = embed.pe if c.positional == "sinusoidal" else embed.position.weight
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
    """Every id's token string: the ``tokenizers`` model's own names where there is one (a
    byte-level BPE shows several ids alike once decoded), else vaswani's."""
    hf = getattr(tokenizer, "hf", None)
    tokens = [hf.id_to_token(i) if hf is not None else tokenizer.token(i)
              for i in range(tokenizer.vocab_size)]
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
    if c.arch == "encoder-decoder":
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
            rotary_base=c.rope_base,
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
    if c.arch == "encoder-decoder":
        spec.config.decoder_start_token = names[specials.bos_id]
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


class Engine:
    """A CTranslate2 export (a folder written by ``vaswani export --format ct2``) used with
    the run's own tokenizer and ``[decode]`` defaults, which the export keeps under
    ``vaswani/``: ``vaswani translate DIR --engine ct2`` and ``vaswani generate DIR --engine
    ct2`` run on it.

    Beam scores are CTranslate2's: the sum of the tokens' log-probabilities (``<eos>``
    included) divided by ``length ** length_penalty`` (not GNMT's ``((5 + length) / 6) **
    alpha``, which vaswani's own beam search uses); with ``length_penalty=0`` both are the raw
    log-probability."""

    def __init__(self, folder: str | Path, *, device: str = "cpu", compute_type: str = "default",
                 threads: int = 0) -> None:
        try:
            import ctranslate2
        except ImportError:
            raise ImportError("--engine ct2 needs CTranslate2: pip install 'vaswani[export]'") \
                from None
        from .. import rundir
        from . import SOURCE

        folder = Path(folder)
        if not (folder / "model.bin").exists() or not (folder / SOURCE).is_dir():
            raise FileNotFoundError(f"{folder} is not a CTranslate2 export of a vaswani run (no "
                                    f"model.bin and {SOURCE}/); make one with `vaswani export "
                                    "RUN_DIR --format ct2 --out DIR`")
        self.config = rundir.read_config(folder / SOURCE)
        self.source, target, _ = rundir.read_tokenizers(folder / SOURCE)
        self.target = target or self.source
        self.source_tokens = vocabulary(self.source)
        self.index = {t: i for i, t in enumerate(vocabulary(self.target))}
        engine = (ctranslate2.Translator if self.config.model.arch == "encoder-decoder"
                  else ctranslate2.Generator)
        self.model = engine(str(folder), device=device, compute_type=compute_type,
                            intra_threads=threads)  # 0: CTranslate2's default

    def _text(self, tokens: list[str]) -> str:
        return self.target.decode([self.index[t] for t in tokens])

    def translate(self, texts: list[str], *, beam: int | None = None, n_best: int = 1,
                  length_penalty: float | None = None, repetition_penalty: float = 1.0,
                  no_repeat_ngram_size: int = 0, min_length: int = 0,
                  batch_size: int = 64) -> list[str] | list[list[tuple[str, float]]]:
        """Like ``Run.translate``: each text's translation, or with ``n_best > 1`` its
        ``n_best`` best (translation, score), best first."""
        from ..tasks.base import encode_inputs

        if self.config.model.arch != "encoder-decoder":
            raise ValueError("this export is a language model; use generate")
        d = self.config.decode
        beam = beam or d.beam
        results = [[("", 0.0)] * n_best for _ in texts]
        todo = [i for i, t in enumerate(texts) if t.strip()]
        ids = encode_inputs(self.source, [texts[i] for i in todo], self.config.model.max_len,
                            eos=True)
        for start in range(0, len(todo), batch_size):
            chunk, batch = todo[start:start + batch_size], ids[start:start + batch_size]
            out = self.model.translate_batch(
                [[self.source_tokens[i] for i in x] for x in batch], beam_size=beam,
                num_hypotheses=n_best, return_scores=True,
                length_penalty=d.length_penalty if length_penalty is None else length_penalty,
                # capped like vaswani's own search: past max_len there are no positions
                max_decoding_length=min(int(d.max_len_a * max(map(len, batch)) + d.max_len_b),
                                        self.config.model.max_len - 1),
                repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
                min_decoding_length=min_length)
            for i, r in zip(chunk, out, strict=True):
                results[i] = [(self._text(h), s) for h, s in zip(r.hypotheses, r.scores,
                                                                  strict=True)]
        return results if n_best > 1 else [best[0][0] for best in results]

    def generate(self, prompt: str, *, max_new_tokens: int | None = None,
                 temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None,
                 repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0,
                 min_length: int = 0) -> str:
        """Like ``Run.generate``: the continuation of ``prompt`` (greedy at temperature 0)."""
        import ctranslate2

        if self.config.model.arch != "decoder":
            raise ValueError("this export is a translator; use translate")
        d = self.config.decode
        temperature = d.temperature if temperature is None else temperature
        if seed is not None:
            ctranslate2.set_random_seed(seed)
        start = self.source.encode(prompt) or [self.source.bos_id]
        greedy = temperature == 0
        out = self.model.generate_batch(
            [[self.source_tokens[i] for i in start]],
            max_length=max_new_tokens or d.max_new_tokens, include_prompt_in_result=False,
            sampling_topk=1 if greedy else (top_k or d.top_k or 0),
            sampling_topp=1.0 if greedy else (top_p or d.top_p or 1.0),
            sampling_temperature=1.0 if greedy else temperature,
            repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
            min_length=min_length, end_token=self.source_tokens[self.source.eos_id])
        return self._text(out[0].sequences[0])
