"""On a CUDA GPU: mixed-precision training (bf16, fp16 with a gradient scaler), SDPA's
flash and memory-efficient kernels against the written-out attention, cached against
uncached generation, the serve routes, a run moved between cuda and cpu, export."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.testing import assert_close

import vaswani
from tests.training.fixtures import config, reverse_task, text_file
from vaswani.nn import masks, scaled_dot_product_attention
from vaswani.training.train import Launch, train

CUDA = torch.device("cuda")


def losses(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}


def lm_run(tmp_path, name, model=None, **train_options):
    cfg = config(tmp_path / f"{name}.toml", "decoder", text_file(tmp_path / "t.txt"),
                 train={"max_steps": 6, "eval_every": 6, "device": "cuda", **train_options},
                 model=model)
    train(str(cfg), [], out=str(tmp_path / name), launch=Launch(progress=False))
    return tmp_path / name


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_tracks_fp32(tmp_path, precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    fp32 = losses(lm_run(tmp_path, "fp32"))
    mixed_dir = lm_run(tmp_path, precision, precision=precision)
    mixed = losses(mixed_dir)
    assert f'precision = "{precision}"' in (mixed_dir / "config.toml").read_text()
    for step in fp32:
        assert mixed[step] == pytest.approx(fp32[step], rel=0.03)
    assert any(mixed[s] != fp32[s] for s in fp32)


@pytest.mark.parametrize("backend", [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])
def test_fused_sdpa_kernels_equal_the_written_out_attention(backend):
    """Padding (a key mask) and causal masks; flash takes only is_causal, no mask."""
    B, H, T, D = 3, 4, 37, 64
    q, k, v = (torch.randn(B, H, T, D, device=CUDA, dtype=torch.bfloat16) for _ in range(3))
    causal = masks.causal_mask(T, T).to(CUDA)
    ref, _ = scaled_dot_product_attention(q.double(), k.double(), v.double(), causal)
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    if backend == SDPBackend.EFFICIENT_ATTENTION:
        lengths = torch.tensor([T, 20, 5], device=CUDA)
        keep = torch.arange(T, device=CUDA)[None, :] < lengths[:, None]
        mask = masks.combine(masks.key_padding_mask(keep), causal)
        ref, _ = scaled_dot_product_attention(q.double(), k.double(), v.double(), mask)
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


def test_cached_generation_equals_uncached_on_cuda(tmp_path):
    from vaswani.generation.reference import generate

    run = vaswani.load(lm_run(tmp_path, "lm"), device="cuda")
    tok = run.source_tokenizer
    for prompt in ["to be", "the", "or not to"]:
        ids = tok.encode(prompt)
        kw = {"max_new_tokens": 12, "bos_id": tok.bos_id, "eos_id": tok.eos_id,
              "temperature": 0.0}
        assert generate(run.model, ids, use_cache=True, **kw) == \
            generate(run.model, ids, use_cache=False, **kw)
    # and the engine (the CUDA-graph decode steps) agrees with both
    assert run.generate("to be", max_new_tokens=12, temperature=0) == tok.decode(
        generate(run.model, tok.encode("to be"), use_cache=False, **kw))


def test_a_run_trained_on_cuda_resumes_on_cpu_and_back(tmp_path):
    data = reverse_task(tmp_path / "p.tsv")
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data,
                 train={"max_steps": 6, "save_every": 2, "eval_every": 6, "device": "cuda"})
    run = tmp_path / "run"
    train(str(cfg), ["train.max_steps=2"], out=str(run), launch=Launch(progress=False))
    train(None, ["train.max_steps=4", "train.device=cpu"], resume=str(run),
          launch=Launch(progress=False))
    train(None, ["train.max_steps=6", "train.device=cuda"], resume=str(run),
          launch=Launch(progress=False))
    assert sorted(losses(run)) == list(range(1, 7))
    out = vaswani.load(run, device="cpu").translate(["abc"], beam=2)
    assert out == vaswani.load(run, device="cuda").translate(["abc"], beam=2)


def test_a_cuda_trained_run_exports_and_matches(tmp_path):
    from vaswani.export import export

    run = lm_run(tmp_path, "lm", model={"norm_first": True, "activation": "gelu"})  # GPT-2's
    export(run, "hf", tmp_path / "hf")  # the export's own check compares on the check batch
    assert (tmp_path / "hf" / "config.json").exists()


def test_every_serve_route_on_cuda(tmp_path):
    """The reported bug: /v1/completions without temperature answered 500 on cuda."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from vaswani.serve import create_app

    lm = vaswani.load(lm_run(tmp_path, "lm"), device="cuda")
    with TestClient(create_app({"lm": lm}), base_url="http://127.0.0.1") as c:
        for body in [{"prompt": "to be", "max_tokens": 5},
                     {"prompt": "to be", "max_tokens": 5, "temperature": 0.8, "seed": 1},
                     {"prompt": "to be", "max_tokens": 5, "stream": True}]:
            r = c.post("/v1/completions", json={"model": "lm", **body})
            assert r.status_code == 200, r.text
        r = c.post("/v1/attention", json={"model": "lm", "input": "to be"})
        assert r.status_code == 200, r.text


def test_a_cpu_generator_draws_for_rows_on_the_gpu_as_for_rows_on_the_cpu():
    from vaswani.generation.sampling import sample_rows

    logits = torch.randn(3, 50)
    hot, off, ones = torch.ones(3), torch.zeros(3, dtype=torch.long), torch.ones(3)

    def draw(device):
        gens = [None, torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)]
        return sample_rows(logits.to(device), hot.to(device), off.to(device), ones.to(device),
                           gens)[1:].tolist()

    assert draw(CUDA) == draw("cpu")


def test_flash_attention_takes_the_training_steps_attention():
    """On a GPU the tasks' attention runs under the flash kernel alone (an explicit mask
    would find no kernel): a language model and a translator of unpadded sources."""
    from tests.models.test_unmasked import model

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", torch.bfloat16):
        wide = {"d_model": 64, "n_heads": 4}  # heads of 16: a width flash takes
        lm = model("decoder", "sdpa", **wide).float().cuda()
        ids = torch.randint(3, 23, (2, 16), device="cuda")
        lm(ids, mask=True).sum().backward()
        mt = model("encoder-decoder", "sdpa", **wide).float().cuda()
        src, tgt = (torch.randint(3, 23, (2, n), device="cuda") for n in (12, 9))
        mt(src, tgt, src_mask=True, tgt_mask=True).sum().backward()


def test_a_model_for_a_gpu_has_none_of_the_cpus_paths(tmp_path):
    """cpu/'s modules (per-call attention choice, oneDNN linear layers, lane dropout) only
    fall back on a GPU, at a Python cost per call: a model built or loaded for CUDA has
    none, a CPU's has them."""
    from vaswani import ModelConfig, build_model

    def cpu_modules(model):
        return [type(m).__name__ for m in model.modules()
                if type(m).__module__.startswith("vaswani.cpu")]

    shape = ModelConfig(arch="decoder", vocab_size=30, d_model=32, n_heads=4, d_ff=64,
                        n_layers=1, max_len=32)
    assert cpu_modules(build_model(shape, "cpu"))
    assert cpu_modules(build_model(shape, CUDA)) == []
    cfg = config(tmp_path / "c.toml", "decoder", text_file(tmp_path / "t.txt"),
                 train={"max_steps": 2}, device="cuda")
    train(str(cfg), [], out=str(tmp_path / "run"), launch=Launch(progress=False))
    assert cpu_modules(vaswani.load(tmp_path / "run", device="cuda").model) == []


def test_a_gpu_feed_pins_the_next_steps_batches_while_this_one_runs():
    from tests.training.test_feed import Numbered
    from vaswani.training.feed import Feed

    feed = Feed(Numbered(), CUDA, 2)
    first = feed.take(0)
    assert all(b["x"].is_cuda for b in first)
    upcoming = feed.next[1].result()
    assert all(b["x"].is_pinned() for b in upcoming)
    feed.close()
