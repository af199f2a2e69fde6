"""Qwen3-MoE (Hugging Face ``Qwen3MoeForCausalLM``; Qwen3-30B-A3B, Qwen3-235B-A22B) on
vaswani's own modules: Qwen3's attention (norms over each head's queries and keys, heads set
apart from hidden / heads) and, in every layer, a mixture of experts in place of the
feed-forward block (nn/moe.py): a router without bias picks ``num_experts_per_tok`` of
``num_experts`` SwiGLU experts of width ``moe_intermediate_size`` for each token, weighted by
its softmax, renormalised over the chosen where ``norm_topk_prob``. Training adds the
Switch Transformer's load-balancing loss, weighted by ``router_aux_loss_coef``.

Checkpoints on the Hub hold one tensor per expert (``mlp.experts.{e}.gate_proj``, ...), as
``save_pretrained`` writes them; the 3D tensors ``transformers`` keeps in memory
(``mlp.experts.gate_up_proj`` (E, 2I, D), ``down_proj`` (E, D, I)) are read too. A model
whose dense layers are mixed with sparse ones (``decoder_sparse_step``, ``mlp_only_layers``)
is refused.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import ModelConfig
from . import GGUF, Architecture, Refused, unsupported
from .llama import (
    GGUF_BLOCKS,
    check_common,
    fixes,
    gguf_settings,
    hf_fields,
    llama_config,
    refuse_layout,
    sizes,
)
from .maps import (
    as_float,
    attention_projections,
    attention_projections_back,
    ends,
    ends_back,
    gated_feed_forward,
    take,
)
from .qwen3 import NORMS

DESCRIBED = "Qwen3-MoE (Qwen3's attention, a mixture of experts in every layer)"


def config_from_hf(hf: dict, pad_id: int | None = None) -> ModelConfig:
    """A Hugging Face ``Qwen3MoeConfig`` (config.json as a dict) -> ModelConfig."""
    check_common(hf, head_dim=True)
    if hf.get("attention_bias"):
        raise unsupported("attention_bias", True, "no biases on the attention's projections")
    if hf.get("decoder_sparse_step", 1) != 1:
        raise unsupported("decoder_sparse_step", hf["decoder_sparse_step"],
                          "a mixture of experts in every layer (1)")
    if hf.get("mlp_only_layers"):
        raise unsupported("mlp_only_layers", hf["mlp_only_layers"],
                          "a mixture of experts in every layer (none dense)")
    experts = hf.get("num_experts", hf.get("num_local_experts"))
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    return llama_config(**sizes(hf, pad_id), head_dim=head_dim, qk_norm=True,
                        experts={"count": experts, "per_token": hf["num_experts_per_tok"],
                                 "d_ff": hf["moe_intermediate_size"],
                                 "renormalize": bool(hf.get("norm_topk_prob", False)),
                                 "aux_loss": float(hf.get("router_aux_loss_coef", 0.001))})


def _experts(hf: dict[str, Tensor], h: str, o: str, c: ModelConfig) -> dict[str, Tensor]:
    """One layer's router and experts: one tensor per expert (the Hub's files), or the
    experts stacked into 3D tensors, gate and up together (transformers' in memory) or
    apart (llama.cpp's GGUF files)."""
    d, ff, n = c.d_model, c.experts.d_ff, c.experts.count
    out = {o + "router.weight": take(hf, h + "gate.weight", n, d)}
    if h + "experts.0.gate_proj.weight" in hf:
        for e in range(n):
            out.update(gated_feed_forward(hf, f"{h}experts.{e}.", f"{o}experts.{e}.", d, ff))
        return out
    if h + "experts.gate_proj.weight" in hf:  # llama.cpp's, each of the three stacked
        gate_up = torch.cat([take(hf, h + "experts.gate_proj.weight", n, ff, d),
                             take(hf, h + "experts.up_proj.weight", n, ff, d)], dim=1)
        down = take(hf, h + "experts.down_proj.weight", n, d, ff)
    else:
        gate_up = take(hf, h + "experts.gate_up_proj", n, 2 * ff, d)
        down = take(hf, h + "experts.down_proj", n, d, ff)
    for e in range(n):
        out[f"{o}experts.{e}.linear1.weight"] = gate_up[e]
        out[f"{o}experts.{e}.linear2.weight"] = down[e]
    return out


def from_hf(hf: dict[str, Tensor], config: ModelConfig, settings: dict) -> dict[str, Tensor]:
    """``Qwen3MoeForCausalLM`` weights -> DecoderLM state dict: Qwen3's attention, and each
    layer's router and experts under ``feed_forward``."""
    c, d = config, config.d_model
    out = ends(hf, c)
    for i in range(c.n_decoder_layers):
        h, o = f"model.layers.{i}.", f"decoder.layers.{i}."
        out.update(attention_projections(hf, h, o, c))
        out.update(_experts(hf, h + "mlp.", o + "feed_forward.", c))
        out[o + "self_block.norm.weight"] = take(hf, h + "input_layernorm.weight", d)
        out[o + "ff_block.norm.weight"] = take(hf, h + "post_attention_layernorm.weight", d)
        for n in NORMS:
            out[f"{o}{n}.weight"] = take(hf, f"{h}{n}.weight", c.head_dim)
    return as_float(out, c)


def to_hf(model, c: ModelConfig) -> dict[str, Tensor]:
    """DecoderLM -> ``Qwen3MoeForCausalLM``'s names, its experts as the 3D tensors
    ``transformers`` holds in memory (``save_pretrained`` writes them one per expert, as the
    Hub's checkpoints hold them)."""
    sd = model.state_dict()
    out = ends_back(model, c, sd)
    for i in range(c.n_decoder_layers):
        o, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        out.update(attention_projections_back(sd, o, h, c))
        out[h + "mlp.gate.weight"] = sd[o + "feed_forward.router.weight"]
        for ours, theirs in (("linear1", "gate_up_proj"), ("linear2", "down_proj")):
            out[f"{h}mlp.experts.{theirs}"] = torch.stack(
                [sd[f"{o}feed_forward.experts.{e}.{ours}.weight"] for e in range(c.experts.count)])
        out[h + "input_layernorm.weight"] = sd[o + "self_block.norm.weight"]
        out[h + "post_attention_layernorm.weight"] = sd[o + "ff_block.norm.weight"]
        for n in NORMS:
            out[f"{h}{n}.weight"] = sd[f"{o}{n}.weight"]
    return out


def hf_model(c: ModelConfig, ids: dict[str, int]):
    import transformers

    config = transformers.Qwen3MoeConfig(
        **hf_fields(c, ids), head_dim=c.head_dim, attention_bias=False,
        use_sliding_window=False, num_experts=c.experts.count,
        num_experts_per_tok=c.experts.per_token, moe_intermediate_size=c.experts.d_ff,
        norm_topk_prob=c.experts.renormalize, router_aux_loss_coef=c.experts.aux_loss,
        decoder_sparse_step=1, mlp_only_layers=[], architectures=["Qwen3MoeForCausalLM"])
    return transformers.Qwen3MoeForCausalLM(config)


FIXED = fixes(qk_norm=True, **{"experts.count": None})  # Qwen3's layout; its experts


def refuse(c: ModelConfig) -> None:
    if not c.experts.count:
        raise Refused("experts.count", c.experts.count, f"{DESCRIBED} needs experts")
    refuse_layout(c, DESCRIBED, FIXED, any_head_dim=True)


def _gguf_settings(read) -> dict:
    """A ``qwen3moe`` GGUF file's expert settings; llama.cpp renormalises the chosen experts'
    weights unless the file says otherwise."""
    return {**gguf_settings("qwen3moe")(read),
            "num_experts": int(read("qwen3moe.expert_count")),
            "num_experts_per_tok": int(read("qwen3moe.expert_used_count")),
            "moe_intermediate_size": int(read("qwen3moe.expert_feed_forward_length")),
            "norm_topk_prob": bool(read("qwen3moe.expert_weights_norm", True))}


GGUF_EXPERTS = {"ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.gate_proj",
                "ffn_up_exps": "mlp.experts.up_proj", "ffn_down_exps": "mlp.experts.down_proj"}

ARCHITECTURE = Architecture(
    name="qwen3_moe", hf_types=("qwen3_moe",), hf_class="Qwen3MoeForCausalLM",
    config_from_hf=config_from_hf, from_hf=from_hf, to_hf=to_hf, hf_model=hf_model,
    refuse=refuse, fixes=FIXED, peft=True,
    gguf=GGUF({**{k: v for k, v in GGUF_BLOCKS.items() if not k.startswith("ffn_")},
               "ffn_norm": GGUF_BLOCKS["ffn_norm"], "attn_q_norm": "self_attn.q_norm",
               "attn_k_norm": "self_attn.k_norm", **GGUF_EXPERTS},
              _gguf_settings, name="qwen3moe"))
