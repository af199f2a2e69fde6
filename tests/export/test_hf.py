"""Hugging Face export: tiny trained runs of each family load with transformers' Auto classes
and give vaswani's logits (within 1e-4, fp32) and greedy outputs; the exported tokenizer gives
the run's ids; every option without a counterpart is refused by name."""

import pytest
import torch

import vaswani
from tests.training.fixtures import classification_file, config, text_file
from vaswani.cli import main
from vaswani.config import ModelConfig
from vaswani.export import ExportError, export
from vaswani.training.train import Launch, train

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
from vaswani.export.hf import check  # noqa: E402

KINDS = {
    # BERT: post-LN, a norm after the embeddings, learned positions, a mean-pooled head
    "bert": ("encoder", classification_file, {"norm_first": False, "embed_norm": True,
                                              "positional": "learned", "activation": "gelu",
                                              "scale_embeddings": False}, "bpe"),
    # GPT-2: sinusoidal positions and sqrt(d) scaling, both folded into the exported tables
    "gpt2": ("decoder", text_file, {"norm_first": True, "activation": "gelu",
                                    "positional": "sinusoidal", "scale_embeddings": True},
             "char"),
    # LLaMA: RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases
    "llama": ("decoder", text_file, {"norm_first": True, "positional": "rope", "norm": "rmsnorm",
                                     "activation": "swiglu", "bias": False, "n_kv_heads": 2,
                                     "scale_embeddings": False}, "bpe"),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{family: (vaswani Run, export folder, training text file)}."""
    base = tmp_path_factory.mktemp("hf")
    out = {}
    for family, (arch, maker, model, tokenizer) in KINDS.items():
        data = maker(base / (f"{family}.tsv" if arch == "encoder" else f"{family}.txt"))
        cfg = config(base / f"{family}.toml", arch, data, model=model,
                     data={"tokenizer": tokenizer, "vocab_size": 300},
                     train={"max_steps": 30, "eval_every": 30, "metric_examples": 0})
        run_dir = base / family
        train(str(cfg), [], out=str(run_dir), launch=Launch(progress=False))
        export(run_dir, "hf", base / f"{family}-hf")
        out[family] = (vaswani.load(run_dir), base / f"{family}-hf", data)
    return out


def _sample_lines(path, n=20):
    text = path.read_text()
    if "\t" in text:  # labelled TSV: the text column
        return [line.split("\t", 1)[1] for line in text.splitlines()[1:n + 1]]
    return [text[i:i + 60] for i in range(0, 60 * n, 60)]


@pytest.mark.parametrize("family", list(KINDS))
def test_tokenizer_gives_the_runs_ids(exported, family):
    run, folder, data = exported[family]
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    lines = _sample_lines(data)
    ids = hf_tok(lines)["input_ids"]
    prefix = [run.source_tokenizer.bos_id] if run.config.model.arch == "encoder" else []
    assert ids == [prefix + run.source_tokenizer.encode(line) for line in lines]
    assert hf_tok.decode(ids[1], skip_special_tokens=True) == run.source_tokenizer.decode(ids[1])
    assert hf_tok.pad_token_id == run.source_tokenizer.pad_id


def _padded(run, lines):
    prefix = [run.source_tokenizer.bos_id] if run.config.model.arch == "encoder" else []
    rows = [prefix + run.source_tokenizer.encode(line)[:40] for line in lines]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), run.source_tokenizer.pad_id)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
    return ids, ids != run.source_tokenizer.pad_id


def test_bert_hidden_states_and_head_match(exported):
    from safetensors.torch import load_file

    run, folder, data = exported["bert"]
    hf = transformers.AutoModel.from_pretrained(folder).eval()
    ids, keep = _padded(run, _sample_lines(data, 6))
    with torch.no_grad():
        ours = run.model.encode(ids, mask=keep)
        theirs = hf(input_ids=ids, attention_mask=keep.long()).last_hidden_state
        assert (ours - theirs)[keep].abs().max() < 1e-4
        head = load_file(str(folder / "classification_head.safetensors"))
        pooled = (theirs * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)
        logits = pooled @ head["weight"].T + head["bias"]
        assert (logits - run.model(ids, mask=keep)).abs().max() < 1e-4


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_language_model_logits_and_greedy_match(exported, family):
    run, folder, data = exported[family]
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(hf).__name__ == {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[family]
    ids = torch.tensor([run.source_tokenizer.encode(data.read_text()[:50])])
    with torch.no_grad():
        assert (run.model(ids) - hf(input_ids=ids).logits).abs().max() < 1e-4
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    for prompt in ["to be", "the question"]:
        ours = run.generate(prompt, max_new_tokens=15, temperature=0)
        prompt_ids = tok(prompt, return_tensors="pt")["input_ids"]
        out = hf.generate(prompt_ids, max_new_tokens=15, do_sample=False, eos_token_id=None,
                          attention_mask=torch.ones_like(prompt_ids))
        assert tok.decode(out[0, prompt_ids.size(1):], skip_special_tokens=True) == ours


@pytest.mark.parametrize("change, message", [
    ({"arch": "encoder-decoder"}, "arch = 'encoder-decoder' has no counterpart"),
    ({"arch": "encoder", "norm_first": True, "embed_norm": True},
     "norm_first = True has no counterpart there (BERT"),
    ({"arch": "encoder", "norm_first": False}, "embed_norm = False"),
    ({"arch": "encoder", "norm_first": False, "embed_norm": True, "positional": "rope"},
     "BERT takes learned or sinusoidal"),
    ({"arch": "encoder", "norm_first": False, "embed_norm": True, "activation": "swiglu"},
     "activation = 'swiglu'"),
    ({"positional": "none"}, "positional = 'none'"),
    ({"norm_first": False}, "norm_first = False has no counterpart there (GPT-2"),
    ({"norm": "rmsnorm"}, "norm = 'rmsnorm' has no counterpart there (GPT-2"),
    ({"bias": False}, "bias = False"),
    ({"n_kv_heads": 2}, "n_kv_heads = 2"),
    ({"positional": "rope", "activation": "gelu", "norm": "rmsnorm", "bias": False},
     "activation = 'gelu' has no counterpart there (LLaMA"),
    ({"embed_norm": True}, "embed_norm = True"),
    ({"type_vocab_size": 2}, "type_vocab_size = 2"),
])
def test_options_without_a_counterpart_are_refused(change, message):
    base = dict(arch="decoder", vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_layers=1,
                norm_first=True, activation="gelu")
    with pytest.raises(ExportError) as e:
        check(ModelConfig(**{**base, **change}))
    assert message in str(e.value)


def test_quantize_is_refused_outside_ct2(exported, tmp_path, capsys):
    run, _, _ = exported["gpt2"]
    assert main(["export", str(run.run_dir), "--format", "hf", "--out", str(tmp_path / "x"),
                 "--quantize", "int8"]) == 2
    assert "--quantize int8 is for --format ct2" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_an_imported_bert_goes_back_to_the_same_weights(tmp_path):
    """Import (HF -> vaswani) then export (vaswani -> HF) gives back the original BERT: every
    tensor equal, the same hidden states, the same tokenizer template ([CLS] ... [SEP])."""
    from safetensors.torch import load_file

    from tests.reliability.checkpoints import bert_folder
    from vaswani.pretrained.importer import import_bert

    original = bert_folder(tmp_path / "bert")
    run_dir = import_bert(str(original), tmp_path / "run", tmp_path / "cache")
    export(run_dir, "hf", tmp_path / "back")
    before = load_file(str(original / "model.safetensors"))
    after = load_file(str(tmp_path / "back/model.safetensors"))
    shared = [k for k in before if not k.startswith("pooler.")]
    assert sorted(shared) == sorted(after)
    for name in shared:
        assert torch.equal(before[name], after[name]), name
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    assert tok("abc")["input_ids"] == [2, 4, 5, 6, 3]
    model = transformers.AutoModel.from_pretrained(tmp_path / "back").eval()
    reference = transformers.BertModel.from_pretrained(original).eval()
    ids = torch.tensor([tok("hello world")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).last_hidden_state, reference(ids).last_hidden_state,
                              atol=1e-6)
