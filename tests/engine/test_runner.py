"""A row's logits do not depend on what shares its batch (engine/runner.py): with weight-only
int8 layers, which compute row by row, every log-probability a request gets is the same to
the bit alone and beside requests of other lengths, whatever the batch's longest row, its
number of rows or its mix of prefills and decoding steps. Float32 layers are left out: BLAS
picks its kernel by the number of rows, so their last bits may move (they are tested token
for token in test_engine.py).

With ``bf16_prefill`` (a prompt's products widened to bfloat16: cpu/quantized.py) the same
holds: a prompt token is computed widened and a generated one by the kernel, whichever pass
carries it (a chunked prompt's last token, a preempted or slid row's recomputing, a chat's
next turn after its kept prompt). The widened path is forced on, whatever this CPU has."""

import pytest
import torch

from tests.conftest import DEVICE
from vaswani import ModelConfig, build_model
from vaswani.cpu import attention, quantized
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
    return [torch.randint(3, 300, (3 + 7 * i % 39,), generator=g, device="cpu").tolist()
            for i in range(24)]


@pytest.fixture(params=[False, True], ids=["kernel", "widened-prompts"])
def bf16_prefill(request, monkeypatch):
    """Each test twice: every product by the kernel, and prompts' products widened."""
    if request.param:
        monkeypatch.setattr(quantized, "bf16_products", lambda: True)
    return request.param


def logprobs(model, batch, new=12, engine=None, **config):
    """Each request's chosen tokens and their log-probabilities (and the 5 likeliest), from
    ``engine`` or a new one of ``config``."""
    engine = engine or Engine(model, bos_id=BOS, eos_id=EOS, config=EngineConfig(**config))
    requests = [Request(p, Params(max_new_tokens=new, logprobs=5)) for p in batch]
    engine.run(requests)
    return [(r.output, r.logprobs) for r in requests]


def test_an_int8_rows_logits_are_the_same_bits_alone_and_in_any_batch(int8_lm, two_threads,
                                                                       bf16_prefill):
    batch = prompts()
    together = logprobs(int8_lm, batch, bf16_prefill=bf16_prefill)
    for i in (0, 5, 11, 23):
        assert logprobs(int8_lm, [batch[i]], bf16_prefill=bf16_prefill) == [together[i]]
    # admitted six at a time, prompts in chunks, beside other prefills and decoding steps
    for config in (dict(max_rows=6, max_step_tokens=24), dict(max_step_tokens=16),
                   dict(shared_chunk=8, max_step_tokens=16)):
        assert logprobs(int8_lm, batch, bf16_prefill=bf16_prefill, **config) == together


def test_preempted_and_slid_rows_keep_their_bits(int8_lm, two_threads, bf16_prefill):
    """Rows recomputed after a preemption or past ``max_len`` (96) get the bits of a row
    that computed everything once, alone."""
    batch = prompts()[::3]
    together = logprobs(int8_lm, batch, new=70, bf16_prefill=bf16_prefill)  # slides
    squeezed = Engine(int8_lm, bos_id=BOS, eos_id=EOS,
                      config=EngineConfig(cache_tokens=192, bf16_prefill=bf16_prefill))
    assert logprobs(int8_lm, batch, new=70, engine=squeezed) == together
    assert squeezed.scheduler.preemptions > 0
    # arriving one a step, as a server's do: a prefill pass holds one row's prompt beside
    # another's generated tokens (recomputed after a preemption)
    batch = prompts()[:12]
    squeezed = Engine(int8_lm, bos_id=BOS, eos_id=EOS,
                      config=EngineConfig(cache_tokens=192, bf16_prefill=bf16_prefill))
    requests = [Request(p, Params(max_new_tokens=40, logprobs=5)) for p in batch]
    for request in requests:
        squeezed.submit(request)
        squeezed.step()
    while squeezed.busy:
        squeezed.step()
    assert [(r.output, r.logprobs) for r in requests] == \
        logprobs(int8_lm, batch, new=40, bf16_prefill=bf16_prefill)


def test_a_widened_chats_next_turn_has_the_bits_of_its_whole_prompt(int8_lm, two_threads,
                                                                    monkeypatch):
    """A widened request keeps its prompt as a prefix, not its answer, which the next turn
    computes widened, as its own prompt. (Without widening a kept answer computed by
    decoding steps has the same products but attention summed in another order than a
    prefill's: the same tokens, test_prefixes.py.)"""
    monkeypatch.setattr(quantized, "bf16_products", lambda: True)
    chat = Engine(int8_lm, bos_id=BOS, eos_id=EOS, config=EngineConfig(bf16_prefill=True))
    # the first turn's prompt (12 tokens) too short to widen: computed by the kernel and
    # kept with its answer, which the widened turns after it do not find
    history = prompts()[9][:12]
    for turn in range(4):
        (output, _), = logprobs(int8_lm, [history], engine=chat)
        history = history + output + [7 + turn, 9, 11]
        kept = chat.scheduler.prefixes.hit
        assert logprobs(int8_lm, [history], engine=chat) == \
            logprobs(int8_lm, [history], prefix_bytes=0, bf16_prefill=True)
        assert (chat.scheduler.prefixes.hit > kept) == (turn > 0)  # after a kept prefix


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
