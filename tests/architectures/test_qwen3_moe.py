"""Qwen3-MoE (vaswani/architectures/qwen3_moe.py) against transformers'
``Qwen3MoeForCausalLM``: a mixture of four experts in every layer, two per token, router
probabilities renormalised, Qwen3's attention (checks.py says what is checked); and what only
a mixture of experts has: the load-balancing loss against transformers' own, the expert
layout transformers keeps in memory, the traced path, training."""

import pytest
import torch
from torch.testing import assert_close

import vaswani
from vaswani.architectures.qwen3_moe import config_from_hf, from_hf
from vaswani.nn.moe import load_balancing_loss

from .checks import SIZES, VOCAB, Checks, imported, lora_steps, random_model

MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, head_dim=16,
           norm_topk_prob=True, tie_word_embeddings=False,
           experts_implementation="eager")  # its grouped matmul takes no float64


class TestQwen3Moe(Checks):
    architecture = "qwen3_moe"
    lora_targets = ("q", "k", "v", "o")  # peft adapts no expert of transformers' 3D tensors

    @staticmethod
    def build(transformers):
        return random_model(transformers, "Qwen3MoeForCausalLM",
                            transformers.Qwen3MoeConfig(**SIZES, **MOE))


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers", reason="transformers is a test dependency")


@pytest.mark.parametrize("recompute", [False, True])
def test_training_loss_and_gradients_are_transformers_with_load_balancing(transformers,
                                                                          tmp_path, recompute):
    """One batch's training loss (the task's, as `vaswani train` computes it) is
    transformers' own: cross-entropy plus ``router_aux_loss_coef`` times the Switch
    Transformer's loss, and the routers' and experts' gradients are the same (float64, but
    for transformers' cross-entropy, taken in float32), with the layers' activations kept
    or recomputed in the backward pass (``checkpoint_activations``)."""
    model = random_model(transformers, "Qwen3MoeForCausalLM", transformers.Qwen3MoeConfig(
        **SIZES, **{**MOE, "router_aux_loss_coef": 0.5}))
    run = vaswani.load(imported(model, tmp_path)[1])
    assert run.config.model.experts.aux_loss == 0.5
    ids = torch.randint(1, VOCAB, (2, 17))
    inputs, target = ids[:, :-1], ids[:, 1:].contiguous()
    ours = run.model.double().train()
    ours.decoder.checkpoint_activations = recompute
    loss, nll, n = run.task.next_token_loss(ours, inputs, target)
    (loss / n).backward()
    theirs = model.double().train()
    out = theirs(input_ids=inputs, labels=target, shift_labels=target,
                 output_router_logits=True)
    out.loss.backward()
    # transformers takes the cross-entropy in float32
    assert_close(loss / n, out.loss.double(), atol=1e-6, rtol=1e-6)
    assert_close(nll / n, (out.loss - 0.5 * out.aux_loss).double(), atol=1e-6, rtol=1e-6)
    assert out.aux_loss > 1.0  # two of four experts a token: 2 when routing is uniform
    for i in range(SIZES["num_hidden_layers"]):
        mine, hf = ours.decoder.layers[i].feed_forward, theirs.model.layers[i].mlp
        assert_close(mine.router.weight.grad, hf.gate.weight.grad, atol=1e-7, rtol=1e-5)
        assert_close(torch.stack([e.linear2.weight.grad for e in mine.experts]),
                     hf.experts.down_proj.grad, atol=1e-7, rtol=1e-5)


def test_load_balancing_loss_is_transformers_own_with_padding(transformers):
    """nn/moe.py's loss over three layers' router scores, padding rows left out, equals
    transformers' ``load_balancing_loss_func`` given the attention mask."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    torch.manual_seed(0)
    logits = [torch.randn(2 * 7, 5) for _ in range(3)]
    keep = torch.ones(2, 7, dtype=torch.bool)
    keep[1, 4:] = False
    expected = load_balancing_loss_func(tuple(logits), 5, 2, keep.long())
    assert_close(load_balancing_loss(logits, 2, keep), expected)
    assert_close(load_balancing_loss(logits, 2), load_balancing_loss_func(tuple(logits), 5, 2))
    assert not torch.allclose(load_balancing_loss(logits, 2, keep), load_balancing_loss(logits, 2))


def test_experts_as_transformers_keeps_them_in_memory_import_alike(transformers, tmp_path):
    """A checkpoint holding the 3D tensors transformers keeps in memory (``gate_up_proj``
    (E, 2I, D), ``down_proj`` (E, D, I)) imports as the Hub's one-tensor-per-expert file."""
    model = TestQwen3Moe.build(transformers)
    config = vaswani.load(imported(model, tmp_path / "a")[1]).config.model
    per_expert = {k: v.clone() for k, v in model.state_dict().items()}
    hub = {}
    for i in range(SIZES["num_hidden_layers"]):
        h = f"model.layers.{i}.mlp.experts."
        gate_up, down = per_expert[h + "gate_up_proj"], per_expert[h + "down_proj"]
        for e in range(MOE["num_experts"]):
            gate, up = gate_up[e].chunk(2)
            hub.update({f"{h}{e}.gate_proj.weight": gate, f"{h}{e}.up_proj.weight": up,
                        f"{h}{e}.down_proj.weight": down[e]})
    hub.update({k: v for k, v in per_expert.items() if ".mlp.experts." not in k})
    from_3d = from_hf(dict(per_expert), config, {})
    from_hub = from_hf(hub, config, {})
    assert from_3d.keys() == from_hub.keys()
    for name in from_3d:
        assert torch.equal(from_3d[name], from_hub[name]), name


def test_a_dense_layer_among_the_experts_is_refused(transformers):
    with pytest.raises(ValueError, match="mlp_only_layers"):
        config_from_hf({**TestQwen3Moe.build(transformers).config.to_dict(),
                        "mlp_only_layers": [1]})
    with pytest.raises(ValueError, match="decoder_sparse_step"):
        config_from_hf({**TestQwen3Moe.build(transformers).config.to_dict(),
                        "decoder_sparse_step": 2})


def test_other_architectures_refuse_experts():
    """A run with experts exports only as Qwen3-MoE: LLaMA's, Gemma 3's and CTranslate2's
    layouts have no place for them."""
    from vaswani.architectures import Refused, named, of
    from vaswani.config import ModelConfig
    from vaswani.export import ExportError
    from vaswani.export.ct2 import check

    llama = named("llama").config_from_hf({**SIZES, "hidden_act": "silu"})
    moe = llama.replace(experts={"count": 4, "d_ff": 24})
    assert of(moe.replace(architecture="")).name == "qwen3_moe"
    named_count = r"\[model.experts\] count = [04]"
    with pytest.raises(Refused, match=named_count):
        named("llama").refuse(moe)
    with pytest.raises(Refused, match=named_count):
        named("qwen3_moe").refuse(llama.replace(qk_norm=True))
    with pytest.raises(ExportError, match=named_count):
        check(moe)
    with pytest.raises(ValueError, match=r"\[model.experts\] count \(2\)"):
        ModelConfig(arch="encoder", vocab_size=10, experts={"count": 2})


def test_adapters_on_the_experts_train_merge_and_are_refused_by_peft_by_name(transformers,
                                                                              tmp_path):
    """LoRA on every expert's gate, up and down (each expert its own adapters): two steps
    train only adapters; the hf export refuses peft's format by name and writes the merged
    model with ``--merge``, whose logits in transformers are vaswani's."""
    from vaswani.export import ExportError, export

    model = TestQwen3Moe.build(transformers)
    run_dir = imported(model, tmp_path)[1]
    lora_steps(run_dir, tmp_path, ["q", "gate", "up", "down"])
    with pytest.raises(ExportError, match="an expert of a mixture of experts"):
        export(tmp_path / "lora", "hf", tmp_path / "peft")
    assert not (tmp_path / "peft").exists()
    out = export(tmp_path / "lora", "hf", tmp_path / "merged", merge=True)
    merged = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    merged.config._experts_implementation = "eager"
    ours = vaswani.load(tmp_path / "lora").model
    ids = torch.randint(1, VOCAB, (2, 12))
    with torch.no_grad():
        base = vaswani.load(run_dir).model
        assert (base(ids) - ours(ids)).abs().max() > 1e-3  # the adapters changed the model
        assert_close(merged(input_ids=ids).logits, ours(ids), rtol=1e-4, atol=1e-4)
