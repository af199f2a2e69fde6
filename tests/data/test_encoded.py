"""Encoded datasets (data/encoded.py, data/encode.py): on small data the memory-mapped path
gives exactly the tokenizers, token ids, batches and resume fingerprint of the in-memory
reference (tests/tasks/reference_data.py), for every task, char and BPE; caches are reused,
rebuilt when an input changes, never taken half-written, never trusted when damaged; bad lines
still say file:line."""

import json
import random
import shutil
import threading

import numpy as np
import pytest
import torch

from tests.data.test_batching import reference_token_budget_batches
from tests.tasks.reference_data import fingerprint, reference
from tests.training.fixtures import config
from vaswani.atomic import one_at_a_time
from vaswani.config import load_run_config
from vaswani.data import encode, encoded
from vaswani.data.batching import BatchPlan, lm_windows
from vaswani.data.files import DataError
from vaswani.tasks import task_for

WORDS = ["the", "king", "sent", "servants", "to", "city", "ñandú", "día", "go", "and"]


def text_lines(rng: random.Random, n: int) -> list[str]:
    """Lines with what makes byte-level BPE chunking risky: trailing spaces and tabs, blank
    lines, runs of spaces, punctuation, digits, non-ASCII."""
    lines = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(0, 9))]
        line = rng.choice([" ", "  ", ", "]).join(words)
        line += rng.choice(["", "", " ", "  ", "\t", ".", "!", " 42"])
        lines.append(line)
    return lines


def make(tmp_path, task: str, variant: str):
    rng = random.Random(hash((task, variant)) % 1000)
    if task == "translation":
        path = tmp_path / "pairs.tsv"
        lines = [f"{a.strip() or 'x'}\t{b.strip() or 'y'}" for a, b in
                 zip(text_lines(rng, 300), text_lines(rng, 300), strict=True)]
        path.write_text("\n".join(lines) + "\n")
        return {"train": [str(path)]}
    if task == "lm":
        parts = [tmp_path / f"part{i}.txt" for i in range(2)]
        for p in parts:
            p.write_text("\n".join(text_lines(rng, 400)))
        if variant == "valid-files":
            valid = tmp_path / "valid.txt"
            valid.write_text("\n".join(text_lines(rng, 60)))
            return {"train": [str(p) for p in parts], "valid": [str(valid)]}
        return {"train": [str(p) for p in parts]}
    labels = ["pos", "neg", "mid"]
    rows = [(rng.choice(labels), " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))))
            for _ in range(240)]
    if variant == "jsonl":
        path = tmp_path / "l.jsonl"
        path.write_text("".join(json.dumps({"label": a, "text": b}) + "\n" for a, b in rows))
    elif variant == "csv":
        path = tmp_path / "l.csv"
        path.write_text("label,text\n" + "".join(f'{a},"{b}, ""q"""\n' for a, b in rows))
    else:
        path = tmp_path / "l.tsv"
        path.write_text("label\ttext\n" + "".join(f"{a}\t{b}\n" for a, b in rows))
    return {"train": [str(path)]}


CASES = [("translation", "char", "shared"), ("translation", "bpe", "shared"),
         ("translation", "bpe", "separate"), ("lm", "char", "held-out"),
         ("lm", "bpe", "held-out"), ("lm", "bpe", "valid-files"),
         ("classification", "char", "tsv"), ("classification", "bpe", "jsonl"),
         ("classification", "bpe", "csv")]
ARCH = {"translation": "encoder-decoder", "lm": "decoder", "classification": "encoder"}


@pytest.mark.parametrize("task_name, kind, variant", CASES, ids=["-".join(c) for c in CASES])
def test_encoded_data_equals_the_in_memory_reference(tmp_path, monkeypatch, task_name, kind,
                                                     variant):
    monkeypatch.setattr(encode, "CHUNK_CHARS", 97)  # many text chunks: their seams are tested
    paths = make(tmp_path, task_name, variant)
    cfg = load_run_config(config(
        tmp_path / "c.toml", ARCH[task_name], paths["train"][0],
        data={"tokenizer": kind, "vocab_size": 400, "train": paths["train"],
              "valid": paths.get("valid", []), "shared_vocab": variant != "separate",
              "max_tokens": 300, "block_size": 16},
        model={"max_len": 24}))
    task = task_for(cfg)
    data = task.load(tmp_path / "cache")
    train, valid, tokenizers, labels = reference(cfg, kind, task_name)
    for ours, theirs in zip((data.source_tokenizer, data.target_tokenizer), tokenizers,
                            strict=True):
        if theirs is not None:
            assert ours.vocab_size == theirs.vocab_size
            assert [ours.token(i) for i in range(ours.vocab_size)] == \
                [theirs.token(i) for i in range(theirs.vocab_size)]
    assert data.labels == labels
    assert data.legacy_fingerprint() == fingerprint(train)
    if task_name == "lm":
        assert np.array_equal(np.asarray(data.train), train.numpy())
        assert np.array_equal(np.asarray(data.valid), valid.numpy())
        for i in range(5):  # batches: windows of the same ids
            a = lm_windows(data.train, i, 0, 8, 16)
            b = lm_windows(train, i, 0, 8, 16)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        return
    as_lists = [tuple(x.tolist() if isinstance(x, np.ndarray) else int(x) for x in e)
                for e in data.train]
    assert as_lists == [tuple(e) for e in train]
    assert [tuple(x.tolist() if isinstance(x, np.ndarray) else int(x) for x in e)
            for e in data.valid] == [tuple(e) for e in valid]
    # batches: the plan from the memory maps == the example-by-example plan on the lists
    lengths = ([max(len(s), len(t)) for s, t in train] if task_name == "translation"
               else [len(ids) for ids, _ in train])
    old = BatchPlan(reference_token_budget_batches(lengths, 300, 1), cfg.train.seed)
    batches = task.batches(data, 0, 1)
    for i in range(2 * len(old)):
        ours = batches.micro_batch(i)
        theirs = task.collate([train[j] for j in old.indices(i)])
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), i


def lm_config(tmp_path, **data):
    text = tmp_path / "t.txt"
    if not text.exists():
        text.write_text("\n".join(text_lines(random.Random(0), 500)))
    return load_run_config(config(tmp_path / "c.toml", "decoder", text,
                                  data={"block_size": 16, **data}))


def test_a_second_load_maps_the_cache_and_a_changed_input_is_rebuilt(tmp_path, capsys):
    cfg = lm_config(tmp_path)
    first = task_for(cfg).load(tmp_path / "cache")
    assert "encoded the lm data" in capsys.readouterr().err
    again = task_for(cfg).load(tmp_path / "cache")
    err = capsys.readouterr().err
    assert "encoded" not in err and "trained" not in err  # tokenizer and data from the cache
    assert again.directory == first.directory and isinstance(again.train, np.memmap)
    text = tmp_path / "t.txt"
    text.write_text(text.read_text() + "\nmore text")
    third = task_for(cfg).load(tmp_path / "cache")
    err = capsys.readouterr().err
    assert f"{text} changed since" in err and "encoding again" in err
    assert len(third.train) > len(first.train)


def test_two_loads_of_one_dataset_at_once_take_turns(tmp_path, monkeypatch):
    """Two trainings started together on the same data: the second, finding no encoding,
    waits for the first's lock instead of encoding beside it (and replacing the folder the
    first is reading), then maps what the first built. Here the test is the first: it holds
    both locks, puts a finished encoding in place, and lets go; the second builds nothing."""
    cfg = lm_config(tmp_path)
    done = task_for(cfg).load(tmp_path / "done")  # the encoding "the first process" makes
    cache = tmp_path / "cache"
    [tokenizer] = (tmp_path / "done" / "encoded" / "tokenizers").glob("lm-*")
    folders = [done.directory, tokenizer]
    builds, missed = [], threading.Event()
    real_lookup, real_build = encoded.lookup, encoded.build

    def lookup(directory, inputs):
        found = real_lookup(directory, inputs)
        missed.set() if found is None else None
        return found

    monkeypatch.setattr(encoded, "lookup", lookup)
    monkeypatch.setattr(encoded, "build", lambda d, w: builds.append(d) or real_build(d, w))
    loaded = []
    with one_at_a_time(cache / "encoded" / folders[0].name), \
            one_at_a_time(cache / "encoded" / "tokenizers" / folders[1].name):
        second = threading.Thread(target=lambda: loaded.append(task_for(cfg).load(cache)))
        second.start()
        assert missed.wait(60)  # the second found nothing: now it must wait for the locks
        for folder in folders:
            shutil.copytree(folder, cache / folder.relative_to(tmp_path / "done"))
    second.join(120)
    assert builds == []
    assert loaded and np.array_equal(loaded[0].train, done.train)


def test_a_half_written_encoding_is_never_used(tmp_path, monkeypatch):
    """A kill in the middle of encoding (simulated: the write fails part-way) leaves only a
    private temporary folder, which the next encoding clears and never reads."""
    cfg = lm_config(tmp_path)
    real = encoded.Writer.close

    def killed(self):
        real(self)
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(encoded.Writer, "close", killed)
    with pytest.raises(KeyboardInterrupt):
        task_for(cfg).load(tmp_path / "cache")
    root = tmp_path / "cache" / "encoded"
    assert not [p for p in root.iterdir() if p.name.startswith("lm-")]
    monkeypatch.setattr(encoded.Writer, "close", real)
    data = task_for(cfg).load(tmp_path / "cache")
    assert len(data.train) > 100
    # a folder left by a process that died (a kill -9) is removed by the next build
    dead = root / f".lm-other.{2 ** 22 + 12345}.abc"
    dead.mkdir()
    (tmp_path / "t.txt").write_text((tmp_path / "t.txt").read_text() + "\nchanged")
    task_for(cfg).load(tmp_path / "cache")
    assert not dead.exists()


def test_bad_lines_still_name_file_and_line_or_are_counted(tmp_path):
    data = tmp_path / "pairs.tsv"
    data.write_text("a\tb\n" * 30 + "no tab here\n" + "c\td\n" * 30)
    cfg = load_run_config(config(tmp_path / "c.toml", "encoder-decoder", data))
    with pytest.raises(DataError, match=r"pairs.tsv:31: expected 2 tab-separated columns"):
        task_for(cfg).load(tmp_path / "cache")
    cfg = load_run_config(config(tmp_path / "c.toml", "encoder-decoder", data,
                                 data={"max_skip": 1}))
    loaded = task_for(cfg).load(tmp_path / "cache")
    assert len(loaded.train) + len(loaded.valid) == 60
    assert loaded.report.skipped == [f"{data}:31: expected 2 tab-separated columns (source, "
                                     "target), found 1"]
    again = task_for(cfg).load(tmp_path / "cache")  # from the cache: the report comes too
    assert again.report.skipped == loaded.report.skipped


def test_the_tokenizer_learns_from_a_seeded_sample_of_a_large_text(tmp_path):
    cfg = lm_config(tmp_path, tokenizer="bpe", vocab_size=300, tokenizer_sample=2000)
    a = task_for(cfg).load(tmp_path / "a")
    b = task_for(cfg).load(tmp_path / "b")
    full = task_for(lm_config(tmp_path, tokenizer="bpe", vocab_size=300)).load(tmp_path / "c")
    ids = lambda tok: [tok.token(i) for i in range(tok.vocab_size)]  # noqa: E731
    assert ids(a.source_tokenizer) == ids(b.source_tokenizer)  # the same seed, the same sample
    assert ids(a.source_tokenizer) != ids(full.source_tokenizer)  # a sample, not everything


LARGE_TEXT = r"""
import json, random, sys, threading, time
from pathlib import Path
from vaswani.training.train import Launch, train
out, size = Path(sys.argv[1]), int(sys.argv[2])
# The process's own memory: anonymous resident pages (heap, tensors, Python objects), sampled
# every 10 ms. Pages of memory-mapped files also count in RSS while they are cached, but the
# kernel drops them under pressure: that is what lets the data exceed the memory.
peak = [0]
def sample():
    while True:
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                peak[0] = max(peak[0], int(line.split()[1]) * 1024)
        time.sleep(0.01)
threading.Thread(target=sample, daemon=True).start()
rng = random.Random(0)
words = "the king sent his servants to the city and they went out into all the world".split()
block = "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 14)))
                  for _ in range(20000)) + "\n"
with (out / "big.txt").open("w") as f:
    for _ in range(size // len(block) + 1):
        f.write(block)
(out / "c.toml").write_text('''[model]
arch = "decoder"
d_model = 32
n_heads = 2
d_ff = 64
n_layers = 1
max_len = 64
[data]
train = "%s"
tokenizer = "char"
block_size = 64
batch_size = 8
[train]
max_steps = 5
eval_every = 5
eval_batches = 2
''' % (out / "big.txt"))
summary = train(str(out / "c.toml"), [], out=str(out / "run"), cache=out / "cache",
                launch=Launch(progress=False))
print(json.dumps({"steps": summary["steps"], "text_bytes": (out / "big.txt").stat().st_size,
                  "peak_bytes": peak[0]}))
"""


@pytest.mark.slow
def test_a_language_model_trains_on_a_text_larger_than_its_memory(tmp_path):
    """A generated text over three times the process's peak anonymous resident memory is
    encoded and trained on (the tokens are read through memory maps, the text in blocks)."""
    import shutil
    import subprocess
    import sys

    size = 1_200_000_000
    try:
        result = subprocess.run([sys.executable, "-c", LARGE_TEXT, str(tmp_path), str(size)],
                                capture_output=True, text=True, timeout=600)
    finally:  # gigabytes: not left for pytest to keep
        (tmp_path / "big.txt").unlink(missing_ok=True)
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    mib = {k: out[k] / 2**20 for k in ("text_bytes", "peak_bytes")}
    summary = f"text {mib['text_bytes']:.0f} MiB, peak anonymous RSS {mib['peak_bytes']:.0f} MiB"
    print(summary)
    assert out["steps"] == 5
    assert out["text_bytes"] > 3 * out["peak_bytes"], summary


def test_encode_ahead_then_train_maps_it_list_and_clean(tmp_path, capsys):
    from tests.training.fixtures import reverse_task
    from vaswani.cli import main

    cfg = config(tmp_path / "c.toml", "encoder-decoder", reverse_task(tmp_path / "p.tsv"),
                 train={"max_steps": 2})
    cache = str(tmp_path / "cache")
    assert main(["data", "encode", str(cfg), "--cache", cache, "--no-progress"]) == 0
    out = capsys.readouterr()
    assert "encoded" in out.err and '"train": {"examples": 285' in out.out
    assert main(["train", str(cfg), "--out", str(tmp_path / "run"), "--cache", cache,
                 "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "encoded the" not in err and "trained the" not in err  # both found in the cache
    assert main(["data", "list", "--cache", cache]) == 0
    assert "translation-" in capsys.readouterr().out
    assert main(["data", "clean", "--cache", cache]) == 0
    assert not (tmp_path / "cache" / "encoded").exists()


def one_file(directory, suffix):
    return next(p for p in directory.iterdir() if p.name.endswith(suffix))


def cut(path):
    path.write_bytes(path.read_bytes()[:1000])


def odd(path):
    path.write_bytes(path.read_bytes() + b"\0")


def manifest_edit(**change):
    def edit(directory):
        manifest = json.loads((directory / "manifest.json").read_text())
        for key, value in change.items():
            *parents, last = key.split(".")
            node = manifest
            for k in parents:
                node = node[k]
            node[last] = value
        (directory / "manifest.json").write_text(json.dumps(manifest))
    return edit


DAMAGE = {
    "cut bin": (lambda d: cut(d / "train.tokens.bin"), "train.tokens.bin holds 1000 bytes"),
    "odd-sized bin": (lambda d: odd(d / "train.tokens.bin"), "train.tokens.bin holds"),
    "missing bin": (lambda d: (d / "train.tokens.bin").unlink(), "train.tokens.bin holds 0"),
    "examples 99,999,999": (manifest_edit(**{"counts.train.examples": 99_999_999}),
                            "counts.train.examples = 99999999, but a text's examples"),
    "tokens -5": (manifest_edit(**{"counts.train.tokens.tokens": -5}),
                  "counts.train.tokens.tokens = -5 is not a count"),
    "dtype uint32": (manifest_edit(dtype="uint32"), "the counts imply"),
    "dtype float64": (manifest_edit(dtype="float64"), "dtype 'float64' is not one of"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_encoding_is_named_and_encoded_again_never_trained_on(tmp_path, capsys,
                                                                        damage):
    cfg = lm_config(tmp_path)
    first = task_for(cfg).load(tmp_path / "cache")
    reference_ids = np.array(first.train)
    break_it, message = DAMAGE[damage]
    break_it(first.directory)
    capsys.readouterr()
    again = task_for(cfg).load(tmp_path / "cache")
    err = capsys.readouterr().err
    assert message in err and "the encoded data is damaged; encoding again" in err, err
    assert str(first.directory) in err  # the file (or its manifest) is named with its folder
    assert np.array_equal(np.asarray(again.train), reference_ids)


def test_offsets_that_end_past_their_tokens_are_damage(tmp_path, capsys):
    from tests.training.fixtures import reverse_task

    cfg = load_run_config(config(tmp_path / "c.toml", "encoder-decoder",
                                 reverse_task(tmp_path / "p.tsv")))
    first = task_for(cfg).load(tmp_path / "cache")
    pairs = [tuple(x.tolist() for x in e) for e in first.train]
    off = first.directory / "train.src.off"
    raw = bytearray(off.read_bytes())
    raw[-8:] = np.int64(10 ** 9).tobytes()
    off.write_bytes(bytes(raw))
    manifest = json.loads((first.directory / "manifest.json").read_text())
    del manifest["files"]  # a dataset encoded before sizes were recorded: counts still check
    (first.directory / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    again = task_for(cfg).load(tmp_path / "cache")
    assert "train.src.off ends at 1000000000" in capsys.readouterr().err
    assert [tuple(x.tolist() for x in e) for e in again.train] == pairs


def test_data_list_marks_damage_and_clean_verify_finds_a_flipped_byte(tmp_path, capsys):
    from vaswani.cli import main

    cfg = lm_config(tmp_path)
    data = task_for(cfg).load(tmp_path / "cache")
    cache = str(tmp_path / "cache")
    assert main(["data", "clean", "--verify", "--cache", cache]) == 0
    assert "0 damaged" in capsys.readouterr().out

    # the same size, one token's low byte changed, still within the vocabulary: only
    # reading the content's checksum finds it
    path = data.directory / "train.tokens.bin"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2 & ~1] ^= 1  # uint16, little-endian: an even byte is a token's low one
    path.write_bytes(bytes(raw))
    assert encoded.damaged(data.directory, data.manifest) is None
    assert main(["data", "clean", "--verify", "--cache", cache]) == 1
    out = capsys.readouterr()
    assert f"{path}: its sha256 differs from the manifest's" in out.err
    assert not data.directory.exists() and "1 damaged dataset(s) removed" in out.out

    again = task_for(cfg).load(tmp_path / "cache")
    cut(again.directory / "train.tokens.bin")
    assert main(["data", "list", "--cache", cache]) == 0
    listed = capsys.readouterr().out
    assert "DAMAGED" in listed and "train.tokens.bin holds 1000 bytes" in listed
