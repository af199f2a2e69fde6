"""`vaswani import hf DIR`: Hugging Face folders of GPT-2, LLaMA (Llama 3's rescaled rotary
frequencies included), Qwen2 and Mistral, written by ``transformers`` itself from random
weights, give vaswani runs with transformers' logits (float64, 1e-6) and greedy tokens, the
folder's tokenizer and chat template; `vaswani export --format hf` writes each back as its
own class with the same logits; what a config asks that vaswani cannot do is refused by name.
"""

import json

import pytest
import torch
from torch.testing import assert_close

import vaswani
from vaswani.cli import main
from vaswani.generation import generate
from vaswani.pretrained.importer import import_checkpoint

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")

TEXT = ("the quick brown fox jumps over the lazy dog. a journey of a thousand miles begins "
        "with a single step. to be or not to be, that is the question. ") * 4
CHAT = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"


def byte_level_tokenizer(bos_first: bool = False):
    """A byte-level BPE as GPT-2's, LLaMA 3's and Qwen2's tokenizer.json are, with their
    end-of-text token (id 0); ``bos_first``: its template starts every text with it, as
    Llama 3's and Gemma's start theirs with ``<bos>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    if bos_first:
        tok.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
    return tok


def configs(vocab: int) -> dict:
    """Each architecture's own config class, tiny, with what sets it apart."""
    llama = dict(vocab_size=vocab, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                 num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
                 rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=0)
    return {
        "gpt2": transformers.GPT2Config(vocab_size=vocab, n_positions=64, n_embd=48, n_layer=2,
                                        n_head=6, bos_token_id=0, eos_token_id=0),
        "llama": transformers.LlamaConfig(**llama, tie_word_embeddings=False),
        # Llama 3.1's rescaled frequencies: original context 32, so most of them are moved
        "llama3": transformers.LlamaConfig(**llama, tie_word_embeddings=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}),
        # Qwen2: biases on q, k, v; an embedding table larger than the tokenizer
        "qwen2": transformers.Qwen2Config(**{**llama, "vocab_size": vocab + 7},
                                          tie_word_embeddings=True),
        "mistral": transformers.MistralConfig(**llama, sliding_window=None),
        # Gemma 3: wide heads, norms on q and k and around each sublayer, GeGLU, local layers
        # (with their own rotary base) every layer but each second
        "gemma3": transformers.Gemma3TextConfig(
            **{**llama, "num_hidden_layers": 4}, head_dim=16, query_pre_attn_scalar=16,
            pad_token_id=0, sliding_window=8, layer_types=["sliding_attention",
                                                            "full_attention"] * 2),
    }


CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM",
           "llama3": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
           "mistral": "MistralForCausalLM", "gemma3": "Gemma3ForCausalLM"}


def hf_folder(folder, family: str, *, shards: bool = False):
    """What `save_pretrained` writes (several safetensors shards and their index if
    ``shards``), with tokenizer.json and a tokenizer_config.json carrying a chat template."""
    tok = byte_level_tokenizer(bos_first=family in ("llama3", "gemma3"))
    config = configs(tok.get_vocab_size())[family]
    torch.manual_seed(0)
    model = getattr(transformers, CLASSES[family])(config).eval()
    with torch.no_grad():  # norms and biases away from their 1/0 init, so they are tested
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(folder, safe_serialization=True,
                          max_shard_size="200KB" if shards else "1GB")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "chat_template": CHAT}))
    return folder


def reference(folder, family: str):
    return getattr(transformers, CLASSES[family]).from_pretrained(folder).double().eval()


@pytest.fixture(scope="module", params=list(CLASSES))
def imported(request, tmp_path_factory):
    family = request.param
    root = tmp_path_factory.mktemp(family)
    folder = hf_folder(root / "hf", family, shards=family == "llama")
    run_dir = import_checkpoint("hf", str(folder), root / "run", root / "cache")
    return family, folder, run_dir


def test_logits_equal_transformers_in_float64(imported):
    family, folder, run_dir = imported
    run = vaswani.load(run_dir)
    ours = run.model.double()
    ids = torch.randint(1, 300, (2, 40))
    with torch.no_grad():
        expected = reference(folder, family)(input_ids=ids).logits
        got = ours(ids, mask=torch.ones_like(ids, dtype=torch.bool))
    assert_close(got, expected, atol=1e-6, rtol=1e-6)


def test_the_run_records_its_architecture(imported):
    family, _, run_dir = imported
    expected = {"llama3": "llama"}.get(family, family)
    assert f'architecture = "{expected}"' in (run_dir / "config.toml").read_text()
    assert vaswani.load(run_dir).config.model.architecture == expected


def test_cached_greedy_tokens_equal_transformers(imported):
    family, folder, run_dir = imported
    ours = vaswani.load(run_dir).model.double()
    hf = reference(folder, family)
    prompt = [17, 45, 101, 8, 60]
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False,
                          attention_mask=torch.ones(1, 5, dtype=torch.long), pad_token_id=0,
                          eos_token_id=None)
    got = generate(ours, prompt, max_new_tokens=40, temperature=0, bos_id=0)
    assert got == out[0].tolist()[5:]  # past the original context of llama3's frequencies


def test_the_engine_decodes_as_the_reference_loop(imported):
    """The engine behind generate and serve (its slot cache: wide heads, q/k norms, Gemma's
    window over rows at different lengths) gives the tokens of generation.generate's plain
    loop, in float32."""
    from vaswani.config import DecodeConfig

    _, _, run_dir = imported
    run = vaswani.load(run_dir)
    prompts = [[17, 45, 101, 8, 60], [9, 33, 70, 12, 5, 88, 140, 61, 7, 200, 3]]
    completions = [run.completion("", DecodeConfig(temperature=0.0, max_new_tokens=30),
                                  ids=prompt) for prompt in prompts]
    run.engine_for(2).run([c.request for c in completions])  # two rows, two lengths
    for prompt, completion in zip(prompts, completions, strict=True):
        expected = generate(run.model, prompt, max_new_tokens=30, temperature=0, bos_id=0)
        assert completion.request.output == expected


def test_the_folders_tokenizer_and_chat_template_come_along(imported):
    family, folder, run_dir = imported
    run = vaswani.load(run_dir)
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    line = "a journey over the lazy fox"
    assert run.source_tokenizer.encode(line) == hf_tok(line, add_special_tokens=False)["input_ids"]
    assert run.source_tokenizer.eos_id == 0
    assert run.chat_template == CHAT
    assert run.source_tokenizer.vocab_size == run.config.model.vocab_size
    # a prompt starts as the folder's tokenizer starts a text (<bos> first for Llama 3 and
    # Gemma, nothing for the others), and a chat prompt that writes it is not given two
    assert run.source_tokenizer.encode_prompt(line) == hf_tok(line)["input_ids"]
    bos_first = run.source_tokenizer.encode_prompt("<|endoftext|>" + line)
    assert bos_first == [0] + hf_tok(line, add_special_tokens=False)["input_ids"]
    assert (family in ("llama3", "gemma3")) == (hf_tok(line)["input_ids"][0] == 0)
    if family == "qwen2":  # the 7 rows past the tokenizer decode to nothing
        assert run.source_tokenizer.decode([5, 300, 306, 5]) == hf_tok.decode([5, 5])


def test_export_writes_the_same_class_back_with_the_same_logits(imported, tmp_path):
    family, folder, run_dir = imported
    assert main(["export", str(run_dir), "--format", "hf", "--out", str(tmp_path / "back")]) == 0
    back = json.loads((tmp_path / "back/config.json").read_text())
    assert back["architectures"] == [CLASSES[family]]
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").double().eval()
    assert type(model).__name__ == CLASSES[family]
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) \
        == "user: hi\n"
    ids = torch.randint(1, 300, (1, 30))
    with torch.no_grad():
        assert_close(model(input_ids=ids).logits, reference(folder, family)(input_ids=ids).logits,
                     atol=1e-6, rtol=1e-6)


REFUSED = [  # (family, a change to config.json, what the error names)
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama", {"attention_bias": True}, "attention_bias"),
    ("llama", {"head_dim": 16}, "head_dim"),
    ("mistral", {"sliding_window": 16}, "sliding_window"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16}, "sliding_window"),
    ("gpt2", {"activation_function": "silu"}, "activation_function"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ("gemma3", {"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ("gemma3", {"layer_types": ["sliding_attention", "full_attention", "full_attention",
                                "sliding_attention"]}, "layer_types"),
    ("llama", {"model_type": "gemma3"}, "model_type 'gemma3' is not supported"),
]


@pytest.mark.parametrize("family, change, named", REFUSED,
                         ids=[f"{f}-{next(iter(c))}" for f, c, _ in REFUSED])
def test_what_vaswani_cannot_do_is_refused_by_name(tmp_path, capsys, family, change, named):
    folder = hf_folder(tmp_path / "hf", family)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    assert main(["import", "hf", str(folder), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert named in err and "config.json" in err
    assert not (tmp_path / "run").exists()


def test_a_folder_without_weights_or_tokenizer_says_which_file(tmp_path, capsys):
    folder = hf_folder(tmp_path / "hf", "llama")
    (folder / "tokenizer.json").unlink()
    assert main(["import", "hf", str(folder), "--out", str(tmp_path / "run")]) == 2
    assert "has no tokenizer.json" in capsys.readouterr().err
    folder = hf_folder(tmp_path / "hf2", "llama")
    (folder / "model.safetensors").write_bytes(b"garbage")
    assert main(["import", "hf", str(folder), "--out", str(tmp_path / "run")]) == 2
    assert "model.safetensors: unreadable weights" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_bert_folder_through_import_hf_is_imported_as_bert(tmp_path):
    from tests.reliability.checkpoints import bert_folder

    run_dir = import_checkpoint("hf", str(bert_folder(tmp_path / "bert")), tmp_path / "run",
                                tmp_path / "cache")
    assert vaswani.load(run_dir).config.model.arch == "encoder"


def test_the_server_reads_a_prompt_as_the_folders_tokenizer_starts_it(imported):
    """/v1/completions with echo gives back the prompt's tokens: <bos> first where the
    folder's tokenizer puts it there."""
    pytest.importorskip("fastapi", reason="vaswani[serve] is not installed")
    from fastapi.testclient import TestClient

    from vaswani.serve import create_app

    family, folder, run_dir = imported
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    line = "the lazy fox"
    with TestClient(create_app({"m": vaswani.load(run_dir)}), base_url="http://127.0.0.1") as c:
        r = c.post("/v1/completions", json={"model": "m", "prompt": line, "max_tokens": 0,
                                            "echo": True, "logprobs": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(hf_tok(line)["input_ids"])


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantized_as_read_equals_quantized_after_a_float_load(imported, kind, monkeypatch):
    """vaswani.load(..., quantize=...) quantizes each linear layer and the token table as
    their weights are read (checkpoint/quantized.py: no whole float model in memory; the
    table in blocks of rows, 7 here so that there are many); the model is the one that
    quantizing a float-loaded model gives, the tied head quantized as a layer of its own,
    biases and norms included, the same logits to the bit."""
    import vaswani.checkpoint.quantized
    from vaswani.cpu.quantized import Int8Embedding, WeightOnlyLinear, quantize_linears

    _, _, run_dir = imported
    monkeypatch.setattr(vaswani.checkpoint.quantized, "TABLE_ROWS", 7)
    streamed = vaswani.load(run_dir, quantize=kind).model
    whole = quantize_linears(vaswani.load(run_dir).model, kind, weight_only=True)
    layers = [(n, m) for n, m in streamed.named_modules() if isinstance(m, WeightOnlyLinear)]
    assert layers and len(layers) == sum(isinstance(m, WeightOnlyLinear)
                                         for m in whole.modules())
    for name, layer in layers:
        other = whole.get_submodule(name)
        assert layer.bits == other.bits and torch.equal(layer.qweight, other.qweight), name
        assert torch.equal(layer.scales, other.scales), name
        assert (layer.bias is None) == (other.bias is None), name
    table, other = streamed.embed.token, whole.embed.token
    assert isinstance(table, Int8Embedding) and isinstance(other, Int8Embedding)
    assert torch.equal(table.qweight, other.qweight) and torch.equal(table.scales, other.scales)
    head = streamed.output_proj  # a tied head reads its table's int8 rows: no second copy
    tied = vaswani.load(run_dir).config.model.tie_embeddings
    assert (head.qweight is table.qweight and head.bits == 8) == tied
    assert (whole.output_proj.qweight is other.qweight) == tied
    a, b = streamed.state_dict(), whole.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.randint(1, 300, (2, 20))
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        assert torch.equal(streamed(ids, mask=mask), whole(ids, mask=mask))


@pytest.mark.parametrize("family", ["gpt2", "llama3", "qwen2", "gemma3"])
def test_converting_takes_each_tensor_out_of_the_checkpoint(tmp_path, family):
    """An import holds the checkpoint once: each converted tensor leaves the dict it was read
    into (what is left is a tied head, which the model does not store twice)."""
    from vaswani.architectures import for_hf
    from vaswani.pretrained import hf

    folder = hf_folder(tmp_path / "hf", family)
    hf_config = json.loads((folder / "config.json").read_text())
    architecture = for_hf(hf_config["model_type"])
    config = architecture.config_from_hf(hf_config)
    weights = hf.read_weights(folder)
    state = architecture.from_hf(weights, config, hf_config)
    assert set(weights) <= {"lm_head.weight"}, sorted(weights)[:5]
    assert state["output_proj.weight"] is state["embed.token.weight"]  # tied in all four


def test_an_imported_model_fine_tunes_sharded_on_two_processes(tmp_path):
    """[train] parallel = "fsdp" from an imported Llama 3 folder (tied embeddings, grouped
    queries, rescaled rotary frequencies): two gloo processes each hold about half of the
    weights and of the optimizer state, the loss falls, and the gathered weights load in one
    process as a run of the same model."""
    import os
    import sys

    from tests import processes
    from tests.processes import free_port
    from tests.training.fixtures import config

    base = import_checkpoint("hf", str(hf_folder(tmp_path / "hf", "llama3")), tmp_path / "base",
                             tmp_path / "cache")
    text = tmp_path / "story.txt"
    text.write_text(TEXT * 4)
    cfg = config(tmp_path / "ft.toml", "decoder", text,
                 train={"init_from": str(base), "parallel": "fsdp", "max_steps": 6,
                        "lr": 3e-3, "warmup": 0, "schedule": "constant", "eval_every": 6,
                        "save_every": 6, "metric_examples": 0, "eval_batches": 1},
                 data={"batch_size": 4, "block_size": 32})
    out = tmp_path / "run"
    done = processes.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "vaswani", "train",
         str(cfg), "--out", str(out), "--no-progress"],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert rows[-1]["loss"] < rows[0]["loss"]  # it learns the text
    shards = {p.name: p.stat().st_size for p in (out / "last/sharded").glob("*.distcp")}
    assert sorted(shards) == ["__0_0.distcp", "__1_0.distcp"]
    assert max(shards.values()) < 0.6 * sum(shards.values())  # each rank: about half
    tuned, start = vaswani.load(out, weights="last"), vaswani.load(base)  # gathered
    assert tuned.config.model == start.config.model
    assert tuned.model.output_proj.weight is tuned.model.embed.token.weight  # still tied
    assert not torch.equal(tuned.model.embed.token.weight, start.model.embed.token.weight)
    assert isinstance(tuned.generate("the quick", max_new_tokens=3, temperature=0), str)
