"""Hugging Face ``transformers``: an encoder run as BERT, a language model as LLaMA (rotary
positions; Qwen2 with biases on q, k and v; Mistral where it was imported as one) or GPT-2
(learned or sinusoidal positions), written so that
``AutoModel.from_pretrained(DIR)`` / ``AutoModelForCausalLM.from_pretrained(DIR)`` and
``AutoTokenizer.from_pretrained(DIR)`` load them. The weight maps are the importers'
(:mod:`vaswani.pretrained.bert`, :mod:`vaswani.pretrained.llama`) run the other way.

What carries over exactly, beyond renaming:

* sinusoidal positions: vaswani's table is written as the learned position embeddings (both
  models add the same vectors);
* ``scale_embeddings`` (token vectors times sqrt(d_model)): the scaled table becomes the input
  embedding and the unscaled one the output projection, untied;
* a run without token types: BERT's one token-type row is zeros (adds nothing);
* GPT-2's ``Conv1D`` stores ``Linear`` weights transposed.

An encoder run's classification head (one linear layer on the mean or first hidden state)
has no counterpart among BERT's heads (``BertForSequenceClassification`` classifies a tanh
"pooler" output), so it is written beside the model as ``classification_head.safetensors``
(``weight``, ``bias``; logits = pool(last_hidden_state) @ weight.T + bias) and its pooling is
named in ``vaswani_head.json``. Translators are refused: Marian, FSMT and BART are post-LN with
their own position tables and start tokens, none an exact match for vaswani's encoder-decoder;
use ``--format ct2`` (or ``onnx``) for them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..config.family import family as arch_family
from ..data.tokenizers import SPECIALS
from . import refuse


def check(config) -> str:
    """The Hugging Face family for this run (``"bert"``, ``"llama"``, ``"qwen2"``,
    ``"mistral"``, ``"gemma3"`` or ``"gpt2"``); an option with no exact counterpart is refused
    by name."""
    c = config
    if arch_family(c.arch).cross:
        raise refuse("hf", "arch", c.arch, "no Hugging Face seq2seq class (Marian, FSMT, "
                     "BART) matches vaswani's encoder-decoder exactly; use --format ct2 or onnx")
    if c.positional == "none":
        raise refuse("hf", "positional", c.positional, "sinusoidal, learned or rope")
    if not arch_family(c.arch).decoder:
        required = {"norm_first": False, "norm": "layernorm", "bias": True, "embed_norm": True}
        name = "BERT (post-LN, LayerNorm with biases, a norm after the embeddings)"
        if c.positional == "rope":
            raise refuse("hf", "positional", c.positional, "BERT takes learned or sinusoidal")
        if c.activation not in ("gelu", "relu"):
            raise refuse("hf", "activation", c.activation, "BERT takes gelu or relu")
        family = "bert"
    elif c.positional == "rope" and (c.qk_norm or c.post_norms or c.sliding_window
                                     or c.activation == "geglu_tanh"):
        required = {"norm_first": True, "norm": "rmsnorm", "activation": "geglu_tanh",
                    "bias": False, "qk_norm": True, "post_norms": True,
                    "scale_embeddings": True, "rope_scaling": "none"}
        name = ("Gemma 3 (RMSNorm before and after each sublayer and on q and k, gated "
                "GELU-tanh, scaled embeddings, rotary positions)")
        family = "gemma3"
    elif c.positional == "rope":
        required = {"norm_first": True, "norm": "rmsnorm", "activation": "swiglu", "bias": False}
        name = "LLaMA (pre-norm, RMSNorm, SwiGLU, no biases, rotary positions)"
        family = "qwen2" if c.qkv_bias else "mistral" if c.origin.startswith("Mistral") \
            else "llama"
        if family == "qwen2" and c.rope_scaling != "none":
            raise refuse("hf", "rope_scaling", c.rope_scaling, "Qwen2 takes plain rotary "
                         "frequencies")
    else:
        required = {"norm_first": True, "norm": "layernorm", "bias": True}
        name = "GPT-2 (pre-LN, LayerNorm with biases, learned positions)"
        if c.activation not in ("gelu", "gelu_tanh", "relu"):
            raise refuse("hf", "activation", c.activation, "GPT-2 takes gelu, gelu_tanh or "
                         "relu")
        if c.n_kv_heads != c.n_heads:
            raise refuse("hf", "n_kv_heads", c.n_kv_heads, "GPT-2 has one key/value head "
                         "per query head")
        family = "gpt2"
    for option, value in required.items():
        if getattr(c, option) != value:
            raise refuse("hf", option, getattr(c, option), f"{name} needs {value!r}")
    if family != "gemma3":
        for option, value in (("qk_norm", False), ("post_norms", False),
                              ("head_dim", c.d_model // c.n_heads)):
            if getattr(c, option) != value:
                raise refuse("hf", option, getattr(c, option), f"{name} needs {value!r}")
    if c.qkv_bias is not None and c.qkv_bias != c.bias and family != "qwen2":
        raise refuse("hf", "qkv_bias", c.qkv_bias, f"{family} has no biases on q, k and v "
                     "alone (Qwen2 does, with rotary positions)")
    if arch_family(c.arch).language_model and c.embed_norm:
        raise refuse("hf", "embed_norm", c.embed_norm, "no norm after the embeddings in "
                     "GPT-2 or LLaMA")
    if arch_family(c.arch).language_model and c.type_vocab_size:
        raise refuse("hf", "type_vocab_size", c.type_vocab_size, "no token types in GPT-2 "
                     "or LLaMA")
    return family


# --- weights ---------------------------------------------------------------------------------

def _input_embeddings(model, c) -> torch.Tensor:
    """The token table as the target adds it: vaswani's scale folded in."""
    return model.embed.token.weight.detach() * model.embed.scale if c.scale_embeddings \
        else model.embed.token.weight.detach()


def _positions(model, c) -> torch.Tensor:
    return model.embed.pe if c.positional == "sinusoidal" else model.embed.position.weight


def bert_state_dict(model, c) -> dict[str, torch.Tensor]:
    """EncoderClassifier -> Hugging Face ``BertModel`` (no pooler)."""
    sd = model.state_dict()
    d = c.d_model
    token_type = (model.embed.token_type.weight if c.type_vocab_size
                  else torch.zeros(1, d))
    out = {"embeddings.word_embeddings.weight": _input_embeddings(model, c),
           "embeddings.position_embeddings.weight": _positions(model, c),
           "embeddings.token_type_embeddings.weight": token_type,
           "embeddings.LayerNorm.weight": sd["embed.norm.weight"],
           "embeddings.LayerNorm.bias": sd["embed.norm.bias"]}
    for i in range(c.n_encoder_layers):
        ours, hf = f"encoder.layers.{i}.", f"encoder.layer.{i}."
        for kind in ("weight", "bias"):
            q, k, v = sd[ours + f"self_attn.in_proj.{kind}"].split(d)
            for name, t in zip(("query", "key", "value"), (q, k, v), strict=True):
                out[hf + f"attention.self.{name}.{kind}"] = t
            out[hf + f"attention.output.dense.{kind}"] = sd[ours + f"self_attn.out_proj.{kind}"]
            out[hf + f"attention.output.LayerNorm.{kind}"] = sd[ours + f"attn_block.norm.{kind}"]
            out[hf + f"intermediate.dense.{kind}"] = sd[ours + f"feed_forward.linear1.{kind}"]
            out[hf + f"output.dense.{kind}"] = sd[ours + f"feed_forward.linear2.{kind}"]
            out[hf + f"output.LayerNorm.{kind}"] = sd[ours + f"ff_block.norm.{kind}"]
    return out


def llama_state_dict(model, c) -> dict[str, torch.Tensor]:
    """DecoderLM (RoPE, RMSNorm, SwiGLU) -> ``LlamaForCausalLM``; the reverse of
    :func:`vaswani.pretrained.llama.convert_state_dict`."""
    sd = model.state_dict()
    hd = c.d_model // c.n_heads
    kv = c.n_kv_heads * hd
    out = {"model.embed_tokens.weight": _input_embeddings(model, c),
           "model.norm.weight": sd["decoder.norm.weight"],
           "lm_head.weight": sd["output_proj.weight"]}
    for i in range(c.n_decoder_layers):
        o, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        q, k, v = sd[o + "self_attn.in_proj.weight"].split([c.d_model, kv, kv])
        if c.qkv_bias:  # Qwen2
            for name, b in zip("qkv", sd[o + "self_attn.in_proj.bias"].split([c.d_model, kv, kv]),
                               strict=True):
                out[h + f"self_attn.{name}_proj.bias"] = b
        out.update({h + "self_attn.q_proj.weight": q, h + "self_attn.k_proj.weight": k,
                    h + "self_attn.v_proj.weight": v,
                    h + "self_attn.o_proj.weight": sd[o + "self_attn.out_proj.weight"],
                    h + "input_layernorm.weight": sd[o + "self_block.norm.weight"],
                    h + "post_attention_layernorm.weight": sd[o + "ff_block.norm.weight"],
                    h + "mlp.down_proj.weight": sd[o + "feed_forward.linear2.weight"]})
        gate, up = sd[o + "feed_forward.linear1.weight"].chunk(2)
        out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate, up
    return out


def gpt2_state_dict(model, c) -> dict[str, torch.Tensor]:
    """DecoderLM (learned or sinusoidal positions, LayerNorm) -> ``GPT2LMHeadModel``.
    ``Conv1D`` weights are (in, out): vaswani's Linear weights transposed."""
    from ..pretrained.gpt2 import LINEARS, NORMS

    sd = model.state_dict()
    out = {"transformer.wte.weight": _input_embeddings(model, c),
           "transformer.wpe.weight": _positions(model, c),
           "transformer.ln_f.weight": sd["decoder.norm.weight"],
           "transformer.ln_f.bias": sd["decoder.norm.bias"],
           "lm_head.weight": sd["output_proj.weight"]}
    for i in range(c.n_decoder_layers):
        o, h = f"decoder.layers.{i}.", f"transformer.h.{i}."
        for theirs, ours in LINEARS.items():
            out[h + theirs + ".weight"] = sd[o + ours + ".weight"].t()
            out[h + theirs + ".bias"] = sd[o + ours + ".bias"]
        for theirs, ours in NORMS.items():
            out[h + theirs + ".weight"] = sd[o + ours + ".weight"]
            out[h + theirs + ".bias"] = sd[o + ours + ".bias"]
    return out


# --- configs -----------------------------------------------------------------------------------

def gemma3_state_dict(model, c) -> dict[str, torch.Tensor]:
    """DecoderLM with Gemma 3's options -> ``Gemma3ForCausalLM`` (which scales its own
    embeddings and multiplies by 1 + each norm's weight); the reverse of
    :func:`vaswani.pretrained.gemma3.convert_state_dict`."""
    from ..pretrained.gemma3 import NORMS

    sd = model.state_dict()
    q_dim, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    out = {"model.embed_tokens.weight": sd["embed.token.weight"],
           "model.norm.weight": sd["decoder.norm.weight"] - 1,
           "lm_head.weight": sd["output_proj.weight"]}
    for i in range(c.n_decoder_layers):
        o, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        q, k, v = sd[o + "self_attn.in_proj.weight"].split([q_dim, kv, kv])
        gate, up = sd[o + "feed_forward.linear1.weight"].chunk(2)
        out.update({h + "self_attn.q_proj.weight": q, h + "self_attn.k_proj.weight": k,
                    h + "self_attn.v_proj.weight": v,
                    h + "self_attn.o_proj.weight": sd[o + "self_attn.out_proj.weight"],
                    h + "mlp.gate_proj.weight": gate, h + "mlp.up_proj.weight": up,
                    h + "mlp.down_proj.weight": sd[o + "feed_forward.linear2.weight"]})
        for theirs, ours in NORMS.items():
            out[h + theirs + ".weight"] = sd[o + ours + ".weight"] - 1
    return out


def _tied(c) -> bool:
    """Input and output embeddings stay one matrix only when nothing scales the input."""
    return c.tie_embeddings and not c.scale_embeddings


def hf_model(family: str, c, specials: dict[str, int]):
    """An empty ``transformers`` model of the family, configured like the run."""
    import transformers

    ids = {"pad_token_id": specials["pad"], "bos_token_id": specials["bos"],
           "eos_token_id": specials["eos"]}
    if family == "bert":
        config = transformers.BertConfig(
            vocab_size=c.vocab_size, hidden_size=c.d_model, num_hidden_layers=c.n_encoder_layers,
            num_attention_heads=c.n_heads, intermediate_size=c.d_ff, hidden_act=c.activation,
            hidden_dropout_prob=c.dropout, attention_probs_dropout_prob=c.attn_dropout,
            max_position_embeddings=c.max_len, type_vocab_size=max(c.type_vocab_size, 1),
            layer_norm_eps=c.norm_eps, architectures=["BertModel"], **ids)
        return transformers.BertModel(config, add_pooling_layer=False)
    if family == "gemma3":
        every = c.global_every if c.sliding_window else 1
        config = transformers.Gemma3TextConfig(
            vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
            num_hidden_layers=c.n_decoder_layers, num_attention_heads=c.n_heads,
            num_key_value_heads=c.n_kv_heads, head_dim=c.head_dim,
            query_pre_attn_scalar=c.head_dim, max_position_embeddings=c.max_len,
            rms_norm_eps=c.norm_eps, sliding_window=c.sliding_window or c.max_len,
            layer_types=["full_attention" if every and (i + 1) % every == 0
                         else "sliding_attention" for i in range(c.n_decoder_layers)],
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": c.rope_base},
                "sliding_attention": {"rope_type": "default",
                                      "rope_theta": c.local_rope_base}},
            tie_word_embeddings=c.tie_embeddings, architectures=["Gemma3ForCausalLM"], **ids)
        return transformers.Gemma3ForCausalLM(config)
    if family in ("llama", "qwen2", "mistral"):
        rope = {"rope_type": "default", "rope_theta": c.rope_base}
        if c.rope_scaling == "llama3":
            rope = {"rope_type": "llama3", "rope_theta": c.rope_base, "factor": c.rope_factor,
                    "low_freq_factor": c.rope_low_freq_factor,
                    "high_freq_factor": c.rope_high_freq_factor,
                    "original_max_position_embeddings": c.rope_original_max_len}
        common = dict(vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
                      num_hidden_layers=c.n_decoder_layers, num_attention_heads=c.n_heads,
                      num_key_value_heads=c.n_kv_heads, max_position_embeddings=c.max_len,
                      rms_norm_eps=c.norm_eps, rope_parameters=rope,
                      tie_word_embeddings=_tied(c), **ids)
        if family == "qwen2":
            config = transformers.Qwen2Config(**common, use_sliding_window=False,
                                              architectures=["Qwen2ForCausalLM"])
            return transformers.Qwen2ForCausalLM(config)
        if family == "mistral":
            config = transformers.MistralConfig(**common, head_dim=c.d_model // c.n_heads,
                                                sliding_window=None,
                                                architectures=["MistralForCausalLM"])
            return transformers.MistralForCausalLM(config)
        config = transformers.LlamaConfig(**common, head_dim=c.d_model // c.n_heads,
                                          attention_bias=False, mlp_bias=False,
                                          architectures=["LlamaForCausalLM"])
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.max_len, n_embd=c.d_model,
        n_layer=c.n_decoder_layers, n_head=c.n_heads, n_inner=c.d_ff,
        activation_function={"gelu_tanh": "gelu_new"}.get(c.activation, c.activation),
        resid_pdrop=c.dropout, embd_pdrop=c.dropout,
        attn_pdrop=c.attn_dropout, layer_norm_epsilon=c.norm_eps,
        tie_word_embeddings=_tied(c), architectures=["GPT2LMHeadModel"], **ids)
    return transformers.GPT2LMHeadModel(config)


STATE_DICTS = {"bert": bert_state_dict, "llama": llama_state_dict, "qwen2": llama_state_dict,
               "mistral": llama_state_dict, "gemma3": gemma3_state_dict,
               "gpt2": gpt2_state_dict}


# --- tokenizer ---------------------------------------------------------------------------------

def hf_tokenizer(run):
    """The run's tokenizer as a ``tokenizers.Tokenizer`` that gives the same ids; for an
    encoder run it adds the ``<bos>`` vaswani puts first (BERT-style templates of imported
    tokenizers are kept as they are)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    tok = run.source_tokenizer
    if tok.kind == "char":
        hf = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tok.itos)},
                                        unk_token="<unk>"))
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        hf.decoder = decoders.Fuse()
        hf.add_special_tokens(list(SPECIALS))
    else:
        hf = Tokenizer.from_str(tok.hf.to_str())
    if tok.kind != "pretrained" and not arch_family(run.config.model.arch).decoder:
        hf.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", tok.bos_id)])
    elif tok.kind != "pretrained":
        hf.post_processor = None
    return hf


def special_names(run) -> dict[str, str]:
    tok = run.source_tokenizer
    names = {}
    for role in ("pad", "bos", "eos", "unk"):
        i = getattr(tok, f"{role}_id")
        names[f"{role}_token"] = tok.token(i) if tok.kind != "char" else tok.itos[i]
    return names


# --- the whole export --------------------------------------------------------------------------

def write(run, out: Path) -> None:
    """Write ``run`` as a Hugging Face model folder at ``out``."""
    from safetensors.torch import save_file

    c = run.config.model
    family = check(c)
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ImportError("the hf format needs transformers: pip install 'vaswani[export]'") \
            from None
    tok = run.source_tokenizer
    specials = {"pad": tok.pad_id, "bos": tok.bos_id, "eos": tok.eos_id}
    model = run.model.float().eval()
    target = hf_model(family, c, specials)
    state = {k: v.detach().float().contiguous().clone()
             for k, v in STATE_DICTS[family](model, c).items()}
    missing, unexpected = target.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (_tied(c) and m == "lm_head.weight")]
    if missing or unexpected:  # a mapping bug, never a user error
        raise RuntimeError(f"hf export ({family}): missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    out.mkdir(parents=True, exist_ok=True)
    target.save_pretrained(out)
    hf_tokenizer(run).save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": c.max_len,
              "clean_up_tokenization_spaces": False, **special_names(run)}
    if run.chat_template:  # an imported chat model's prompt format, for apply_chat_template
        config["chat_template"] = run.chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    if family == "bert" and getattr(model, "head", None) is not None:
        save_file({"weight": model.head.weight.detach().contiguous(),
                   "bias": model.head.bias.detach().contiguous()},
                  str(out / "classification_head.safetensors"))
        (out / "vaswani_head.json").write_text(json.dumps(
            {"pooling": c.pooling, "labels": run.labels,
             "logits": "pool(last_hidden_state) @ weight.T + bias; pool = mean over the "
                       "attention mask" if c.pooling == "mean" else
                       "last_hidden_state[:, 0] @ weight.T + bias"}, indent=2) + "\n")
