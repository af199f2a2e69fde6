"""The nanoGPT comparison's pieces that do not need nanoGPT: its data files, the shared
evaluator, the log parser, loading a checkpoint through a checkout's model.py."""

import math
import pickle
import textwrap

import numpy as np
import pytest
import torch

from benchmarks.nanogpt import (
    load_nanogpt,
    ms_per_iter,
    nanogpt_workdir,
    nats_per_char,
    write_nanogpt_data,
)

TRAIN = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 5
VALID = "All:\nSpeak, speak.\nFirst Citizen:\nYou are all resolved rather to die?\n" * 3


def test_data_files_hold_the_shared_character_ids(tmp_path):
    tok = write_nanogpt_data(TRAIN, VALID + "~", tmp_path)
    train = np.fromfile(tmp_path / "train.bin", dtype=np.uint16)
    val = np.fromfile(tmp_path / "val.bin", dtype=np.uint16)
    assert train.tolist() == tok.encode(TRAIN)
    assert val.tolist() == tok.encode(VALID + "~")   # "~" never seen in training: <unk>
    meta = pickle.loads((tmp_path / "meta.pkl").read_bytes())
    assert meta["vocab_size"] == tok.vocab_size > len(set(TRAIN))
    assert "".join(meta["itos"][i] for i in tok.encode("hear me")) == "hear me"


def test_uniform_model_scores_log_vocabulary():
    ids = list(range(7)) * 40
    vocab = 11
    score = nats_per_char(lambda x: torch.zeros(*x.shape, vocab), ids, window=16)
    assert score["nats_per_char"] == pytest.approx(math.log(vocab))
    assert score["characters"] == len(ids) - 1        # every character after the first
    assert score["windows"] == math.ceil((len(ids) - 1) / 16)


def test_batching_does_not_change_the_score_and_context_is_the_window():
    torch.manual_seed(0)
    ids = torch.randint(0, 9, (333,)).tolist()
    emb = torch.randn(9, 9)

    def bigram_plus_position(x):   # depends on the position in the window: batching must not
        pos = torch.arange(x.shape[1]).float()[None, :, None] / 10
        return emb[x] + pos

    one = nats_per_char(bigram_plus_position, ids, window=20, batch=1)
    many = nats_per_char(bigram_plus_position, ids, window=20, batch=64)
    assert one["nats_per_char"] == pytest.approx(many["nats_per_char"], rel=1e-6)
    # by hand: window starts at 0, 20, 40, ...; targets are the next ids
    total = 0.0
    for s in range(0, len(ids) - 1, 20):
        x = torch.tensor(ids[s: s + 21])
        logits = bigram_plus_position(x[None, :-1])[0]
        total += float(torch.nn.functional.cross_entropy(logits, x[1:], reduction="sum"))
    assert one["nats_per_char"] == pytest.approx(total / (len(ids) - 1), rel=1e-6)


def test_log_parser_reads_nanogpts_iteration_lines():
    log = "\n".join(["tokens per iteration will be: 768", "step 0: train loss 4.4, val loss 4.4"]
                    + [f"iter {i}: loss 2.5215, time {300 if i < 10 else 40 + i % 3}.44ms, "
                       f"mfu 0.03%" for i in range(30)])
    assert ms_per_iter(log) == pytest.approx(41.44)      # the first 10 (warm-up) skipped
    with pytest.raises(RuntimeError, match="no 'iter N"):
        ms_per_iter("step 0: train loss 4.4")


def test_workdir_refuses_a_folder_that_is_not_nanogpt(tmp_path):
    with pytest.raises(SystemExit, match="not a nanoGPT checkout: no train.py"):
        nanogpt_workdir(tmp_path, tmp_path, tmp_path / "w")


def test_checkpoint_loads_through_the_checkouts_model_py(tmp_path):
    (tmp_path / "model.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass
        import torch
        @dataclass
        class GPTConfig:
            vocab_size: int = 5
        class GPT(torch.nn.Module):
            def __init__(self, config):
                super().__init__()
                self.wte = torch.nn.Embedding(config.vocab_size, config.vocab_size)
            def forward(self, idx, targets=None):
                return self.wte(idx), None
    """))
    weights = torch.eye(5) * 3
    torch.save({"model": {"_orig_mod.wte.weight": weights}, "model_args": {"vocab_size": 5},
                "iter_num": 7, "best_val_loss": torch.tensor(1.0)}, tmp_path / "ckpt.pt")
    model, ckpt = load_nanogpt(tmp_path, tmp_path / "ckpt.pt")   # "_orig_mod." prefix removed
    assert torch.equal(model.wte.weight, weights) and ckpt["iter_num"] == 7
