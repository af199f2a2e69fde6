"""Hugging Face ``transformers``: a run written as its architecture's own class (the one
``[model] architecture`` names, or the one its fields match: vaswani/architectures/), so that
``AutoModel.from_pretrained(DIR)`` / ``AutoModelForCausalLM.from_pretrained(DIR)`` and
``AutoTokenizer.from_pretrained(DIR)`` load it. The weight maps and configs are the
architectures' own, the importers' run the other way; this module writes the folder.

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

from ..architectures import Architecture, Refused, of
from ..config.family import family as arch_family
from ..data.tokenizers import SPECIALS
from . import refuse


def check(config) -> Architecture:
    """The architecture this run is written as; an option with no exact counterpart in it
    is refused by name."""
    try:
        architecture = of(config)
        architecture.refuse(config)
    except Refused as e:
        raise refuse("hf", e.option, e.value, e.why) from None
    return architecture


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
    architecture = check(c)
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ImportError("the hf format needs transformers: pip install 'vaswani[export]'") \
            from None
    tok = run.source_tokenizer
    specials = {"pad": tok.pad_id, "bos": tok.bos_id, "eos": tok.eos_id}
    model = run.model.float().eval()
    target = architecture.hf_model(c, specials)
    state = {k: v.detach().float().contiguous().clone()
             for k, v in architecture.to_hf(model, c).items()}
    missing, unexpected = target.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (target.config.tie_word_embeddings
                                          and m == "lm_head.weight")]  # tied: one tensor
    if missing or unexpected:  # a mapping bug, never a user error
        raise RuntimeError(f"hf export ({architecture.name}): missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    out.mkdir(parents=True, exist_ok=True)
    target.save_pretrained(out)
    hf_tokenizer(run).save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": c.max_len,
              "clean_up_tokenization_spaces": False, **special_names(run)}
    if run.chat_template:  # an imported chat model's prompt format, for apply_chat_template
        config["chat_template"] = run.chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    if architecture.name == "bert" and getattr(model, "head", None) is not None:
        save_file({"weight": model.head.weight.detach().contiguous(),
                   "bias": model.head.bias.detach().contiguous()},
                  str(out / "classification_head.safetensors"))
        (out / "vaswani_head.json").write_text(json.dumps(
            {"pooling": c.pooling, "labels": run.labels,
             "logits": "pool(last_hidden_state) @ weight.T + bias; pool = mean over the "
                       "attention mask" if c.pooling == "mean" else
                       "last_hidden_state[:, 0] @ weight.T + bias"}, indent=2) + "\n")
