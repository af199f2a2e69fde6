"""Behaviour every model must have: causality, padding invariance, no NaN, gradients."""

import pytest
import torch
from torch.testing import assert_close

from vaswani import DecoderLM, EncoderClassifier, EncoderDecoder, ModelConfig, build_model

SMALL = dict(d_model=16, n_heads=4, d_ff=32, n_layers=2, dropout=0.0, max_len=32)
VARIANTS = [
    dict(norm_first=False, positional="sinusoidal"),
    dict(norm_first=True, positional="learned", attention="reference"),
    dict(norm_first=True, norm="rmsnorm", activation="gelu", n_kv_heads=2, bias=False),
]


def make(arch, **overrides):
    extra = {"n_classes": 3} if arch == "encoder" else {}
    cfg = ModelConfig(arch=arch, vocab_size=20, **SMALL, **extra, **overrides)
    return build_model(cfg).double().eval()


def test_build_model_returns_the_right_class_with_its_config():
    for arch, cls in [("encoder-decoder", EncoderDecoder), ("decoder", DecoderLM),
                      ("encoder", EncoderClassifier)]:
        model = make(arch)
        assert isinstance(model, cls)
        assert model.config.arch == arch


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder", "encoder"])
def test_build_model_initialises_every_value_as_the_constructor_does(arch):
    """build_model builds on the meta device, allocates, then initialises: every parameter
    and table is set (none left as the allocator's garbage), tied weights stay tied, and the
    values are drawn as the constructor draws them (the same init, without its discarded
    first draws)."""
    from vaswani.models.common import init_weights
    from vaswani.nn.positional import sinusoidal_table

    extra = {"n_classes": 3} if arch == "encoder" else {}
    cfg = ModelConfig(arch=arch, vocab_size=20, pad_id=0, **SMALL, **extra)
    torch.manual_seed(0)
    built = build_model(cfg)
    model = {"encoder-decoder": EncoderDecoder, "decoder": DecoderLM,
             "encoder": EncoderClassifier}[arch](cfg)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.fill_(float("nan"))
    torch.manual_seed(0)
    init_weights(model, cfg.pad_id)
    assert model.state_dict().keys() == built.state_dict().keys()
    for name, value in built.state_dict().items():
        assert_close(model.state_dict()[name], value, rtol=0, atol=0, msg=name)
    for name, t in [*built.named_parameters(), *built.named_buffers()]:
        assert torch.isfinite(t).all(), name
        if t.dim() == 1:
            assert set(t.unique().tolist()) <= {0.0, 1.0}, name  # norms' gains, biases
    for m in built.modules():
        if isinstance(m, torch.nn.Embedding) and m.padding_idx is not None:
            assert m.weight[0].abs().sum() == 0  # the padding row
        if hasattr(m, "pe"):
            assert_close(m.pe, sinusoidal_table(cfg.max_len, cfg.d_model), rtol=0, atol=0)

    def ties(m):  # the names that share one parameter
        names = {}
        for name, p in m.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
        return sorted(n for n in names.values() if len(n) > 1)

    assert ties(built) == ties(model)
    assert len(ties(built)) == (0 if arch == "encoder" else 1)  # the output head
    assert all(p.is_meta for p in build_model(cfg, "meta").parameters())


@pytest.mark.parametrize("variant", VARIANTS)
def test_decoder_lm_is_causal(variant):
    model = make("decoder", **variant)
    ids = torch.randint(1, 20, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = torch.randint(1, 20, (2, 4))
    assert_close(model(ids)[:, :6], model(changed)[:, :6])
    assert not torch.allclose(model(ids)[:, 6:], model(changed)[:, 6:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_encoder_decoder_is_causal_in_the_target(variant):
    model = make("encoder-decoder", **variant)
    src = torch.randint(1, 20, (2, 7))
    tgt = torch.randint(1, 20, (2, 9))
    changed = tgt.clone()
    changed[:, 4:] = torch.randint(1, 20, (2, 5))
    assert_close(model(src, tgt)[:, :4], model(src, changed)[:, :4])


def _pad_to(seqs, length):
    return torch.stack([torch.cat([s, torch.zeros(length - len(s), dtype=torch.long)])
                        for s in seqs])


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_invariance_all_three(variant):
    lengths = [9, 4, 6]
    seqs = [torch.randint(1, 20, (n,)) for n in lengths]
    padded = _pad_to(seqs, 9)

    lm = make("decoder", **variant)
    batch = lm(padded)
    for i, s in enumerate(seqs):
        assert_close(batch[i, : len(s)], lm(s[None])[0])

    clf = make("encoder", **variant)
    batch = clf(padded)
    for i, s in enumerate(seqs):
        assert_close(batch[i], clf(s[None])[0])

    ed = make("encoder-decoder", **variant)
    tgts = [torch.randint(1, 20, (n,)) for n in [3, 7, 5]]
    batch = ed(padded, _pad_to(tgts, 7))
    for i, (s, t) in enumerate(zip(seqs, tgts, strict=True)):
        assert_close(batch[i, : len(t)], ed(s[None], t[None])[0])


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder", "encoder"])
def test_padding_is_config_pad_id_not_zero(arch):
    """With pad_id 3, id 0 is an ordinary token and 3 is masked: a batch padded with 3 gives
    each sequence's own outputs."""
    model = make(arch, pad_id=3)
    seqs = [torch.tensor([0, 5, 0, 7, 9]), torch.tensor([0, 4])]
    padded = torch.stack([seqs[0], torch.tensor([0, 4, 3, 3, 3])])
    out = model(padded, padded) if arch == "encoder-decoder" else model(padded)
    for i, s in enumerate(seqs):
        alone = model(s[None], s[None]) if arch == "encoder-decoder" else model(s[None])
        got = out[i] if arch == "encoder" else out[i, : len(s)]
        assert_close(got, alone[0])


def test_cls_pooling_is_padding_invariant_too():
    clf = make("encoder", pooling="cls")
    seqs = [torch.randint(1, 20, (n,)) for n in [5, 2]]
    batch = clf(_pad_to(seqs, 5))
    for i, s in enumerate(seqs):
        assert_close(batch[i], clf(s[None])[0])


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder", "encoder"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_no_nan_when_a_whole_row_is_padding(arch, norm_first):
    model = make(arch, norm_first=norm_first)
    ids = torch.randint(1, 20, (2, 6))
    ids[1] = 0  # an all-padding sequence
    out = model(ids, ids) if arch == "encoder-decoder" else model(ids)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder", "encoder"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_parameter_receives_a_gradient(arch, variant):
    model = make(arch, **variant).train()
    ids = torch.randint(1, 20, (2, 6))
    out = model(ids, ids) if arch == "encoder-decoder" else model(ids)
    out.pow(2).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_weight_tying_and_shared_embeddings():
    tied = make("encoder-decoder", tie_embeddings=True, share_embeddings=True)
    assert tied.output_proj.weight is tied.tgt_embed.token.weight
    assert tied.src_embed is tied.tgt_embed
    untied = make("encoder-decoder", tie_embeddings=False)
    assert untied.output_proj.weight is not untied.tgt_embed.token.weight
    assert untied.src_embed is not untied.tgt_embed
    lm = make("decoder")
    assert lm.output_proj.weight is lm.embed.token.weight


@pytest.mark.usefixtures("on_cpu")  # the CPU's own path
def test_the_output_projection_follows_its_weight_through_every_change(monkeypatch):
    """Inference on a CPU that is not Intel's multiplies through oneDNN's reordered copy of
    the weight (cpu/linear.py, which a built model's output projection is; forced on here): it
    equals F.linear, and an optimizer step, an in-place edit, a load or a new dtype is seen at
    the next call, never the stale copy."""
    monkeypatch.setattr("vaswani.cpu.linear.OneDNNLinear.onednn", True)
    lm = make("decoder").float().eval()
    proj, x = lm.output_proj, torch.randn(7000, 16)  # enough rows for oneDNN to pay

    def check():
        with torch.no_grad():
            assert_close(proj(x), torch.nn.functional.linear(x, proj.weight))
        with torch.inference_mode():
            assert_close(proj(x), torch.nn.functional.linear(x, proj.weight))

    check()
    assert list(proj._packed) == [(0, proj.out_features)]  # the copy was made and used
    optimizer = torch.optim.SGD(lm.parameters(), lr=1.0)
    lm(torch.tensor([[3, 4, 5]]))[0].sum().backward()  # grad on: the weight itself
    optimizer.step()
    check()
    with torch.no_grad():
        lm.embed.token.weight[7] += 1.0  # the tied embedding, edited in place
    check()
    lm.load_state_dict({k: v * 2 for k, v in lm.state_dict().items()})
    check()
    fused = torch.optim.AdamW(lm.parameters(), lr=1.0, fused=True)  # moves no version
    lm.train()
    lm(torch.tensor([[3, 4, 5]]))[0].sum().backward()
    fused.step()
    lm.eval()
    check()
    assert not any("_packed" in key for key in lm.state_dict())
    lm.double()
    x = x.double()
    check()  # float64: F.linear itself


def test_init_is_xavier_with_a_zero_padding_row():
    model = make("decoder")
    emb = model.embed.token.weight
    assert torch.all(emb[0] == 0)
    bound = (6 / (emb.size(0) + emb.size(1))) ** 0.5
    assert emb.abs().max() <= bound
    assert all(torch.all(m.bias == 0) for m in model.modules()
               if isinstance(m, torch.nn.Linear) and m.bias is not None)


def test_attention_weights_are_returned_per_layer_for_visualisation():
    model = make("encoder-decoder")
    src, tgt = torch.randint(1, 20, (1, 5)), torch.randint(1, 20, (1, 4))
    logits, weights = model.forward_with_attention(src, tgt)
    assert weights["encoder"][0].shape == (1, 4, 5, 5)
    assert weights["cross"][1].shape == (1, 4, 4, 5)
    assert_close(logits, model(src, tgt))
    assert not any(hasattr(m, "last_weights") for m in model.modules())  # nothing kept


def test_wrong_arch_for_class_is_rejected():
    with pytest.raises(ValueError, match="arch"):
        DecoderLM(ModelConfig(arch="encoder-decoder", vocab_size=5))


def test_build_model_makes_its_model_on_torchs_default_device():
    """As any nn.Module: on the device a `with torch.device(...)` block or
    `torch.set_default_device` names (the CPU otherwise), unless one is passed."""
    with torch.device("meta"):
        inside = build_model(ModelConfig(arch="decoder", vocab_size=20, **SMALL))
        named = build_model(ModelConfig(arch="decoder", vocab_size=20, **SMALL), device="cpu")
    assert {p.device.type for p in inside.parameters()} == {"meta"}
    assert {p.device.type for p in named.parameters()} == {"cpu"}


LOAD_AND_USE = """
import sys
import vaswani
from vaswani import ModelConfig, build_model

print(vaswani.load(sys.argv[1]).translate(["abc"]))
for arch, extra in [("decoder", dict(positional="rope", norm="rmsnorm", n_kv_heads=2)),
                    ("encoder", dict(positional="learned", type_vocab_size=2, n_classes=3))]:
    build_model(ModelConfig(arch=arch, vocab_size=20, d_model=16, n_heads=4, d_ff=32,
                            n_layers=1, max_len=32, **extra))
print(sorted(m for m in ("torch._dynamo", "torch.distributed.tensor", "sympy")
             if m in sys.modules))
"""


def test_loading_and_using_a_model_leaves_the_compiler_and_sharding_unimported(copy_run):
    """A model is built on the meta device and then allocated; neither step may make torch
    import torch._dynamo (a random draw or an arange on a meta tensor goes through
    torch._refs, which does: a second added to the start of every command), sympy
    (``empty_like`` of a meta tensor: half a second) or torch.distributed.tensor (half a
    second; only sharding needs it)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", LOAD_AND_USE, str(copy_run[0])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]", done.stdout


def test_an_embedding_made_off_the_meta_device_draws_as_torchs_does():
    from vaswani.nn.positional import embedding

    torch.manual_seed(0)
    ours = embedding(7, 4, padding_idx=2)
    torch.manual_seed(0)
    theirs = torch.nn.Embedding(7, 4, padding_idx=2)
    assert_close(ours.weight, theirs.weight, rtol=0, atol=0)
    assert ours.padding_idx == 2 and not ours.weight[2].any()
    with torch.device("meta"):
        assert embedding(7, 4).weight.is_meta


def test_a_model_built_to_be_loaded_skips_the_random_draws_and_fills_its_tables(device):
    """build_model(initialise=False): parameters allocated, never drawn (what a load
    overwrites); the sinusoidal table, which is not saved, is filled; loaded, it computes what
    the model it was saved from computes."""
    from vaswani.nn.positional import sinusoidal_table

    cfg = ModelConfig(arch="encoder-decoder", vocab_size=20, **SMALL)
    torch.manual_seed(0)
    saved = build_model(cfg).eval()
    state = torch.random.get_rng_state()
    empty = build_model(cfg, initialise=False)
    assert torch.equal(torch.random.get_rng_state(), state)  # no random number drawn
    assert {p.device.type for p in empty.parameters()} == {device.type}  # torch's default
    assert_close(empty.src_embed.position.pe, sinusoidal_table(SMALL["max_len"], SMALL["d_model"]))
    empty.load_state_dict(saved.state_dict())
    src, tgt = torch.randint(1, 20, (2, 7)), torch.randint(1, 20, (2, 5))
    assert_close(empty.eval()(src, tgt), saved(src, tgt), rtol=0, atol=0)


def test_loading_a_run_draws_no_initial_weights(copy_run, monkeypatch):
    import vaswani
    import vaswani.models

    expected = vaswani.load(copy_run[0]).translate(["abcde"])
    monkeypatch.setattr(vaswani.models, "init_weights", lambda *a, **k: pytest.fail("drawn"))
    assert vaswani.load(copy_run[0]).translate(["abcde"]) == expected
