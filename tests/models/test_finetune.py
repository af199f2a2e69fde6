"""models/finetune.py: adapters added to a built model, drawn as a single process draws them
however the model was built, and the base run's weights read into an adapted model."""

import pytest
import torch
from torch.testing import assert_close

from vaswani import ModelConfig, build_model
from vaswani.checkpoint import load_tensors, model_tensors
from vaswani.config import FinetuneConfig
from vaswani.models import materialise
from vaswani.models.common import init_weights
from vaswani.models.finetune import add_adapters, base_names, draw_adapters, new_parts

SMALL = dict(vocab_size=20, d_model=16, n_heads=4, d_ff=32, n_layers=2, dropout=0.0,
             max_len=32, norm="rmsnorm", activation="swiglu", bias=False)
LORA = FinetuneConfig(method="lora", rank=2, alpha=4.0, targets=["q", "v", "o", "up"])


@pytest.mark.parametrize("arch", ["decoder", "encoder"])
def test_adapters_added_on_the_meta_device_are_drawn_as_a_single_process_draws_them(arch):
    """What training/sharding.py does (adapters on the meta device, then the weights drawn,
    the adapters last) gives the model a single process builds, adapters and all: a
    classifier's new head too, whose draws follow the other weights'."""
    config = ModelConfig(arch=arch, n_classes=3 if arch == "encoder" else None, **SMALL)
    torch.manual_seed(0)
    alone = build_model(config, "cpu")
    add_adapters(alone, LORA, trainable=new_parts(config))
    torch.manual_seed(0)
    late = build_model(config, "meta")
    add_adapters(late, LORA, trainable=new_parts(config))
    materialise(late, "cpu")
    init_weights(late, config.pad_id)
    draw_adapters(late)
    a, b = late.state_dict(), alone.state_dict()
    assert a.keys() == b.keys() and any(".lora_A." in name for name in a)
    for name in a:
        assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    assert {n for n, p in late.named_parameters() if p.requires_grad} == \
        {n for n, p in alone.named_parameters() if p.requires_grad}


def test_the_base_runs_weights_go_into_an_adapted_models_frozen_layers():
    """``frozen=True``: every tensor of the base run, under its own names, into the adapted
    model (a LoRA layer's ``p.base.weight``); the adapters are not asked for."""
    config = ModelConfig(arch="decoder", **SMALL)
    torch.manual_seed(0)
    plain = build_model(config, "cpu")
    torch.manual_seed(1)
    adapted = build_model(config, "cpu")
    add_adapters(adapted, LORA)
    names = base_names(adapted)
    assert "decoder.layers.0.self_attn.in_proj.base.weight" in names
    assert names["decoder.layers.0.self_attn.in_proj.base.weight"] == \
        "decoder.layers.0.self_attn.in_proj.weight"
    assert not any(".lora_" in n for n in names)
    load_tensors(adapted, model_tensors(plain), "the base", frozen=True)
    state = adapted.state_dict()
    for name, plain_name in names.items():
        assert_close(state[name], plain.state_dict()[plain_name], rtol=0, atol=0, msg=name)
    with pytest.raises(ValueError, match="missing"):  # every frozen weight, or an error
        load_tensors(adapted, {k: v for k, v in model_tensors(plain).items()
                               if "layers.1." not in k}, "the base", frozen=True)
