"""ONNX export: every family's graphs, run by ONNX Runtime on batches of other shapes than the
export's own sample, give vaswani's outputs within 1e-4; greedy translation through the two
translator graphs, driven by ONNX Runtime in a process of its own (benchmarks/peers.py),
copies like vaswani does."""

import numpy as np
import pytest
import torch

import vaswani
from vaswani.cli import main
from vaswani.export import export

ort = pytest.importorskip("onnxruntime", reason="vaswani[export] is not installed")
pytest.importorskip("onnx", reason="vaswani[export] is not installed")
from benchmarks.peers import run_child  # noqa: E402

STRINGS = ["abcdefghij", "jihgfedcba", "aabbcc", "j", "abcabcabcabcabc"]


def session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def batch(tok, texts, prefix=(), suffix=()):
    rows = [list(prefix) + tok.encode(t) + list(suffix) for t in texts]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), 0)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
    return ids, ids != 0


@pytest.fixture(scope="module")
def copy_onnx(copy_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx") / "copy"
    assert main(["export", str(copy_run[0]), "--format", "onnx", "--out", str(out)]) == 0
    return vaswani.load(copy_run[0]), out


def test_translator_graphs_match_vaswani(copy_onnx):
    run, out = copy_onnx
    tok = run.source_tokenizer
    ids, keep = batch(tok, STRINGS, suffix=[tok.eos_id])  # 5 rows, 16 wide: not the sample
    tgt, _ = batch(tok, ["abc", "jihgfedc", "a"], prefix=[tok.bos_id])
    tgt = torch.cat([tgt, tgt[:2]])
    with torch.no_grad():
        memory = run.model.encode(ids, src_mask=keep)
        logits = run.model.decode(tgt, memory, src_mask=keep)
    got = session(out / "encoder.onnx").run(None, {"input_ids": ids.numpy(),
                                                   "attention_mask": keep.numpy()})[0]
    assert np.abs(got - memory.numpy())[keep.numpy()].max() < 1e-4
    got = session(out / "decoder.onnx").run(None, {"decoder_input_ids": tgt.numpy(),
                                                   "memory": memory.numpy(),
                                                   "attention_mask": keep.numpy()})[0]
    real = (tgt != 0).numpy()
    assert np.abs(got - logits.numpy())[real].max() < 1e-4


def test_greedy_translation_through_onnx_runtime(copy_onnx):
    run, out = copy_onnx
    result = run_child({"engine": "onnxruntime", "task": "translate", "model": str(out),
                        "inputs": STRINGS, "threads": 1, "options": {}})
    assert result["outputs"] == run.translate(STRINGS, beam=1)
    assert result["seconds"] > 0 and result["settings"]["search"] == "greedy"


@pytest.mark.parametrize("arch", ["decoder", "encoder"])
def test_language_model_and_classifier_graphs_match_vaswani(small_runs, tmp_path, arch):
    run_dir, data = small_runs[arch]
    export(run_dir, "onnx", tmp_path / arch)
    run = vaswani.load(run_dir)
    tok = run.source_tokenizer
    texts = ["to be or not", "question", "that is the question to be"]
    prefix = [tok.bos_id] if arch == "encoder" else []
    ids, keep = batch(tok, texts, prefix=prefix)
    with torch.no_grad():
        expected = run.model(ids, mask=keep).numpy()
    got = session(tmp_path / arch / "model.onnx").run(
        None, {"input_ids": ids.numpy(), "attention_mask": keep.numpy()})[0]
    diff = np.abs(got - expected)
    assert (diff.max() if arch == "encoder" else diff[keep.numpy()].max()) < 1e-4
    assert (tmp_path / arch / "onnx_export.json").exists()


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder"])
def test_rotary_positions_are_refused_by_name(tmp_path, arch):
    """They do not trace exactly (ONNX Runtime differed by more than 1 when allowed)."""
    from vaswani.config import ModelConfig, RunConfig
    from vaswani.data.tokenizers import CharTokenizer
    from vaswani.export import ExportError
    from vaswani.export.onnx import write
    from vaswani.inference import Run
    from vaswani.models import build_model

    tok = CharTokenizer("abcdefghij")
    config = ModelConfig(arch=arch, vocab_size=tok.vocab_size, d_model=16, n_heads=2,
                         d_ff=32, n_layers=1, positional="rope", norm_first=True)
    run = Run(tmp_path, RunConfig.from_dict({"model": config.to_dict()}), build_model(config),
              tok, None, [], torch.device("cpu"))
    with pytest.raises(ExportError, match=r"\[model\] positional = 'rope' has no counterpart"):
        write(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_imported_bert_embeds_like_vaswani_in_onnxruntime_alone(tmp_path):
    """An imported BERT (dropout 0.1 in its config) exported and used as an ONNX user would:
    its own tokenizer.json, onnxruntime, mean pooling in numpy. The export once compared
    ONNX with vaswani run in training mode (dropout on) and refused by 1.32."""
    from tokenizers import Tokenizer

    from tests.reliability.checkpoints import bert_folder
    from vaswani.pretrained.importer import import_bert

    source = bert_folder(tmp_path / "bert")
    run_dir = import_bert(str(source), tmp_path / "run", tmp_path / "cache")
    assert main(["export", str(run_dir), "--format", "onnx", "--out", str(tmp_path / "o")]) == 0
    texts = ["hello world", "a", "the quick brown fox jumps"]
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    rows = tok.encode_batch(texts)
    ids = np.array([r.ids for r in rows], dtype=np.int64)
    keep = np.array([r.attention_mask for r in rows], dtype=bool)
    hidden = session(tmp_path / "o" / "model.onnx").run(
        None, {"input_ids": ids, "attention_mask": keep})[0]
    pooled = (hidden * keep[..., None]).sum(1) / keep.sum(1, keepdims=True)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    expected = vaswani.load(run_dir).embed(texts).numpy()
    assert np.abs(pooled - expected).max() < 1e-5
