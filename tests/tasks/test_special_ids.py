"""Special token ids come from the tokenizer, never from assumed constants: a tokenizer whose
<pad>, <bos> and <eos> are 7, 5 and 9 (not 0, 1, 2) trains, evaluates, decodes and draws
attention for each task, and padding with 7 is masked (a padded batch == each input alone)."""

import string

import pytest
import torch

import vaswani
from tests.training.fixtures import classification_file, config, reverse_task, text_file
from vaswani import rundir
from vaswani.config import load_run_config
from vaswani.data.tokenizers import PretrainedTokenizer
from vaswani.tasks import task_for
from vaswani.training.loop import Trainer
from vaswani.training.train import resolve_model

PAD, BOS, EOS, UNK = 7, 5, 9, 6


def odd_tokenizer() -> PretrainedTokenizer:
    """Characters, with the specials in the middle of the vocabulary and 0 a real letter."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    letters = iter(string.ascii_lowercase + " ")
    specials = {PAD: "<pad>", BOS: "<s>", EOS: "</s>", UNK: "<unk>"}
    vocab = {specials.get(i) or next(letters): i for i in range(27 + len(specials))}
    hf = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    hf.decoder = decoders.Fuse()
    hf.add_special_tokens([AddedToken(t, special=True) for t in specials.values()])
    assert hf.token_to_id("a") == 0 and hf.token_to_id("<pad>") == PAD
    return PretrainedTokenizer(hf, {"pad": PAD, "bos": BOS, "eos": EOS, "unk": UNK})


def train_with(tmp_path, arch, data_file, *, steps=60):
    cfg = load_run_config(config(tmp_path / "c.toml", arch, data_file,
                                 train={"max_steps": steps, "eval_every": steps, "lr": 3e-3}))
    task = task_for(cfg)
    tok = odd_tokenizer()
    data = task.load(tmp_path / "cache", (tok, tok if arch == "encoder-decoder" else None))
    cfg = resolve_model(cfg, task, data)
    assert cfg.model.pad_id == PAD
    run_dir = tmp_path / "run"
    rundir.start(run_dir, overwrite=False)
    rundir.write_run(run_dir, cfg, data.source_tokenizer, data.target_tokenizer, data.labels)
    trainer = Trainer(cfg, task_for(cfg), data, run_dir, device=torch.device("cpu"),
                      progress=False)
    first = trainer.evaluate()["valid_loss"]
    result = trainer.fit()
    assert result["valid_loss"] < first  # it learned something
    return vaswani.load(run_dir), data


def test_translation_with_other_special_ids(tmp_path):
    run, data = train_with(tmp_path, "encoder-decoder", reverse_task(tmp_path / "p.tsv"))
    src, tgt = data.train[0]
    assert src[-1] == EOS and tgt[0] == BOS and tgt[-1] == EOS
    texts = ["abc", "fedcbaab", "cab"]
    for beam in (1, 3):
        together = run.translate(texts, beam=beam)
        assert together == [run.translate([t], beam=beam)[0] for t in texts]  # pad 7 masked
    assert "bleu" in run.evaluate([str(tmp_path / "p.tsv")])
    maps = run.attention("abc")
    assert maps["cross-attention"]["queries"][0] == "<s>"
    assert maps["encoder self-attention"]["keys"] == ["a", "b", "c", "</s>"]


def test_language_model_with_other_special_ids(tmp_path):
    run, _ = train_with(tmp_path, "decoder", text_file(tmp_path / "t.txt"))
    text = run.generate("to be", max_new_tokens=10, temperature=0)
    assert 0 < len(text) <= 10 and "<pad>" not in text
    assert run.evaluate([str(tmp_path / "t.txt")])["loss"] > 0
    assert run.attention("to be")["self-attention"]["keys"] == list("to be")


def test_classifier_with_other_special_ids(tmp_path):
    run, _ = train_with(tmp_path, "encoder", classification_file(tmp_path / "l.tsv"))
    texts = ["a good b", "bad a a b c", "c"]
    together = run.classify(texts)
    for text, (label, p) in zip(texts, together, strict=True):
        alone_label, alone_p = run.classify([text])[0]
        assert label == alone_label and p == pytest.approx(alone_p, abs=1e-6)
    assert run.evaluate([str(tmp_path / "l.tsv")])["examples"] == 200
    assert run.attention("a good")["self-attention"]["queries"] == list("a good")
