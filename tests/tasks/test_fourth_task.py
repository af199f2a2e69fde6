"""A fourth task is one new file: tests/tasks/toy_tagging.py defines character tagging (its
Task and its use class) and nothing else in vaswani changes. Training it goes through the
whole of ``vaswani train`` (encoding, batching, checkpoints, resume), using it through
``vaswani.load`` and ``vaswani evaluate``."""

import json
import random

from tests.tasks import toy_tagging
from tests.training.fixtures import config
from vaswani.cli import main

VOWELS = set("aeiou")


def tagging_file(path, n=600, seed=0):
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 12)))
        lines.append(f"{text}\t{''.join('V' if c in VOWELS else 'C' for c in text)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_toy_task_in_one_file_trains_resumes_and_is_used(tmp_path, capsys):
    import vaswani

    data = tagging_file(tmp_path / "tags.tsv")
    cfg = config(tmp_path / "tagging.toml", "encoder", data,
                 data={"task": "tagging"},
                 train={"max_steps": 150, "lr": 3e-3, "eval_every": 50, "save_every": 50,
                        "log_every": 50, "best_metric": "accuracy", "schedule": "constant"})
    run = tmp_path / "run"
    args = ["train", str(cfg), "--out", str(run), "--cache", str(tmp_path / "cache"),
            "--no-progress"]
    assert main(args + ["--set", "train.max_steps=100"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--set", "train.max_steps=150",
                 "--cache", str(tmp_path / "cache"), "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 150 and summary["accuracy"] > 0.95

    tagger = vaswani.load(run)
    assert isinstance(tagger, toy_tagging.Tagger) and tagger.labels == ["C", "V"]
    assert tagger.tag(["banana", "strudel"]) == ["CVCVCV", "CCCVCVC"]
    assert main(["evaluate", str(run), "--data", str(data)]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["task"] == "tagging" and scores["accuracy"] > 0.95
