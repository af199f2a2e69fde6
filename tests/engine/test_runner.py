"""A row's logits do not depend on what shares its batch (engine/runner.py): with weight-only
int8 layers, which compute row by row, every log-probability a request gets is the same to
the bit alone and beside requests of other lengths, whatever the batch's longest row, its
number of rows or its mix of prefills and decoding steps. Float32 layers are left out: BLAS
picks its kernel by the number of rows, so their last bits may move (they are tested token
for token in test_engine.py)."""

import pytest
import torch

from tests.conftest import DEVICE
from vaswani import ModelConfig, build_model
from vaswani.cpu import attention
from vaswani.cpu.quantized import quantize_linears
from vaswani.engine import Engine, EngineConfig, Params, Request

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="int8 weights run on a CPU")
BOS, EOS = 1, 2


def int8_model(**kw):
    """Heads of 64 numbers, as real checkpoints have (the attention kernels' own paths)."""
    torch.manual_seed(0)
    config = ModelConfig(**{**dict(arch="decoder", vocab_size=300, d_model=128, n_heads=2,
                                   d_ff=256, n_layers=2, dropout=0.0, max_len=96, pad_id=0),
                            **kw})
    return quantize_linears(build_model(config).eval(), "int8", weight_only=True)


@pytest.fixture(scope="module")
def int8_lm():
    return int8_model()


def prompts():
    """Lengths that are no multiple of anything: 3 .. 41 tokens."""
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 300, (3 + 7 * i % 39,), generator=g).tolist() for i in range(24)]


def logprobs(model, batch, **config):
    """Each request's chosen tokens and their log-probabilities (and the 5 likeliest)."""
    engine = Engine(model, bos_id=BOS, eos_id=EOS, config=EngineConfig(**config))
    requests = [Request(p, Params(max_new_tokens=12, logprobs=5)) for p in batch]
    engine.run(requests)
    return [(r.output, r.logprobs) for r in requests]


def test_an_int8_rows_logits_are_the_same_bits_alone_and_in_any_batch(int8_lm, two_threads):
    batch = prompts()
    together = logprobs(int8_lm, batch)
    for i in (0, 5, 11, 23):
        assert logprobs(int8_lm, [batch[i]]) == [together[i]]
    # admitted six at a time, prompts in chunks, beside other prefills and decoding steps
    assert logprobs(int8_lm, batch, max_rows=6, max_step_tokens=24) == together
    assert logprobs(int8_lm, batch, shared_chunk=8, max_step_tokens=16) == together


def test_the_engines_passes_choose_their_attention_by_kind_not_by_shape(int8_lm, monkeypatch):
    """A prefill runs SDPA and a decoding step the written-out products, whatever their rows
    and keys; outside the engine a call still chooses by its shape (cpu/attention.py)."""
    seen = []

    def spy(path, name):
        return lambda *args: seen.append((name, attention.PASS.get())) or path(*args)

    monkeypatch.setattr(attention.CPUAttention, "fused",
                        spy(attention.CPUAttention.fused, "fused"))
    monkeypatch.setattr(attention, "decoding_attention",
                        spy(attention.decoding_attention, "decoding"))
    for batch in ([prompts()[3]], prompts()):
        seen.clear()
        logprobs(int8_lm, batch)
        assert set(seen) == {("fused", "prefill"), ("decoding", "decode")}
    seen.clear()
    layer = int8_lm.decoder.layers[0].self_attn.attention
    q, k = torch.randn(2, 2, 1, 64), torch.randn(2, 2, 40, 64)
    with torch.inference_mode():
        layer(q, k, k)  # 2 rows of one query over 40 keys: SDPA pays
    assert seen == [("fused", None)]
