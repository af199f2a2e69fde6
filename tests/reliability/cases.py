"""Bad inputs written down once, for two checkers: the tests (test_bad_inputs.py) give each to
``vaswani.cli.main`` in this process; tests/reliability/probe.py gives each to the ``vaswani``
command in a process of its own, a row of docs/reliability.md's table. Both want the same
thing: exit status 2 and one line, ``vaswani: error: ...``, that says ``message``.

A case's id is its row's in that table. ``arch`` is the kind of run it uses: the tests' small
runs are tests/fixtures/legacy's (``RUN_OF``), the probe trains its own.
"""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

RUN_OF = {"encoder-decoder": "translation", "decoder": "lm", "encoder": "classifier"}

# `vaswani train CONFIG --out NEW ARGS`: refused before NEW is made. ``{dir}`` in an argument:
# an existing directory.
TRAINING = [  # (id, arguments, expected in the message)
    ("device-foo", ["--set", "train.device=foo"], "device ('foo') must be"),
    ("lr-inf", ["--set", "train.lr=inf"], "lr (inf) must be a finite number"),
    ("lr-nan", ["--set", "train.lr=nan"], "lr (nan) must be a finite number"),
    ("beta1-2", ["--set", "train.beta1=2"], "beta1 (2.0) must be in [0, 1)"),
    ("weight-decay-negative", ["--set", "train.weight_decay=-1"],
     "weight_decay (-1.0) must be >= 0"),
    ("min-lr-above-lr", ["--set", "train.min_lr=1"], "min_lr (1.0) must be in [0, lr"),
    ("max-len-1", ["--set", "model.max_len=1"], "max_len (1) must be at least 2"),
    ("temperature-nan", ["--set", "decode.temperature=nan"], "temperature (nan)"),
    ("length-penalty-nan", ["--set", "decode.length_penalty=nan"], "length_penalty (nan)"),
    ("valid-fraction-0", ["--set", "data.valid_fraction=0"], "leaves no validation data"),
    ("best-metric-wrong-task", ["--set", "train.best_metric=accuracy"],
     "best_metric ('accuracy')"),
    ("d-model-not-divisible", ["--set", "model.d_model=30"],
     "d_model (30) must be divisible by n_heads (4)"),
    ("metric-examples-0", ["--set", "train.best_metric=bleu", "--set",
                           "train.metric_examples=0"],
     "metric_examples (0) turns task metrics off"),
    ("data-is-a-directory", ["--set", "data.train={dir}"], "is a directory, not a data file"),
    # sizes no machine holds: refused with the size, before anything is made
    ("d-model-2-40", ["--set", "model.d_model=1099511627776"], "GiB for its weights alone"),
    ("max-len-2-62", ["--set", "model.max_len=4611686018427387904", "--set",
                      "model.positional=learned"], "GiB for its weights alone"),
    ("n-layers-10-8", ["--set", "model.n_layers=100000000"], "100000000 layers"),
    ("seed-10-23", ["--set", "train.seed=100000000000000000000000"],
     "seed (100000000000000000000000) is out of range"),
    ("seed-negative", ["--set", "train.seed=-1"], "seed (-1) must be in [0, 2**63 - 1]"),
    ("bpe-vocab-2-63", ["--set", "data.vocab_size=9223372036854775807"],
     "vocab_size (9223372036854775807) must be at most 16,777,216"),
    ("share-embeddings-with-two-vocabularies", ["--set", "model.share_embeddings=true",
                                                "--set", "data.shared_vocab=false"],
     "share_embeddings = true needs [data] shared_vocab = true"),
    ("warmup-past-a-short-schedule", ["--set", "train.schedule=cosine", "--set",
                                      "train.schedule_steps=1", "--set", "train.warmup=100",
                                      "--set", "train.max_steps=4"],
     "the rate would still be warming up there"),
]

# `vaswani COMMAND RUN REST` (ARGS = [COMMAND, *REST]) on a run of ``arch``, "abc" on stdin
INFERENCE = [  # (id, arch, arguments, expected in the message)
    ("beam-0", "encoder-decoder", ["translate", "--beam", "0"], "need beam (0) >= 1"),
    ("beam-huge", "encoder-decoder", ["translate", "--beam", "100000"], "at most 128"),
    ("n-best-above-beam", "encoder-decoder", ["translate", "--beam", "2", "--n-best", "3"],
     "n_best (3) <= beam"),
    ("length-penalty-nan-flag", "encoder-decoder", ["translate", "--length-penalty", "nan"],
     "must be a finite number"),
    ("top-p-1-5", "decoder", ["generate", "--prompt", "to", "--top-p", "1.5"],
     "top_p (1.5)"),
    ("temperature-negative", "decoder", ["generate", "--prompt", "to", "--temperature", "-1"],
     "temperature (-1.0) >= 0"),
    ("max-new-tokens-0", "decoder", ["generate", "--prompt", "to", "--max-new-tokens", "0"],
     "max_new_tokens (0) must be in [1, 100,000]"),
    ("max-new-tokens-huge", "decoder", ["generate", "--prompt", "to", "--max-new-tokens",
                                        "1000000000"], "max_new_tokens (1000000000)"),
    ("translate-a-language-model", "decoder", ["translate"],
     "translate needs a translation model"),
    ("generate-with-a-translator", "encoder-decoder", ["generate", "--prompt", "a"],
     "generate needs a language model"),
    ("classify-with-a-language-model", "decoder", ["classify"], "classify needs an encoder"),
    ("embed-with-a-translator", "encoder-decoder", ["embed"], "embed needs an encoder"),
    ("device-foo-flag", "encoder-decoder", ["translate", "--device", "foo"],
     "device ('foo')"),
    # torch knows these device types; vaswani runs on cpu, cuda and mps only
    ("device-meta", "encoder-decoder", ["translate", "--device", "meta"],
     "device ('meta') must be"),
    ("device-xpu", "encoder-decoder", ["translate", "--device", "xpu"],
     "device ('xpu') must be"),
    ("input-missing", "encoder-decoder", ["translate", "--input", "/nope.txt"],
     "input file not found"),
    ("input-dev-zero", "encoder-decoder", ["translate", "--input", "/dev/zero"],
     "--input /dev/zero is not a regular file"),
    ("evaluate-data-is-a-directory", "encoder-decoder", ["evaluate", "--data", "/tmp"],
     "is a directory, not a data file"),
    ("evaluate-split-without-files", "encoder-decoder", ["evaluate", "--split", "test"],
     "names no [data] test files"),
    ("attention-head-out-of-range", "encoder-decoder",
     ["attention", "--text", "ab", "--out", "/tmp/a.png", "--head", "9"],
     "head (9) must be in [0, "),
    ("attention-layer-out-of-range", "encoder-decoder",
     ["attention", "--text", "ab", "--out", "/tmp/a.png", "--layer", "7"],
     "layer (7) must be in [0, "),
]


# A translation run, damaged so, then `vaswani translate RUN`
def truncate_weights(run: Path) -> None:
    path = run / "model.safetensors"
    path.write_bytes(path.read_bytes()[:300])


def flip_a_weight_bit(run: Path) -> None:
    path = run / "model.safetensors"
    data = bytearray(path.read_bytes())
    header = struct.unpack("<Q", data[:8])[0]
    data[8 + header + 17] ^= 0x04  # a bit inside the tensor data, not the header
    path.write_bytes(bytes(data))


def flip_a_tokenizer_byte(run: Path) -> None:
    path = run / "tokenizer" / "source.json"
    path.write_text(path.read_text().replace('"a"', '"q"', 1))


def other_d_model(run: Path) -> None:
    path = run / "config.toml"
    path.write_text(re.sub(r"(?m)^d_model = (\d+)$", lambda m: f"d_model = {2 * int(m[1])}",
                           path.read_text(), count=1))


def no_weights(run: Path) -> None:
    (run / "model.safetensors").unlink(missing_ok=True)
    shutil.rmtree(run / "last")


DAMAGE = [  # (id, damage(run), expected in the message)
    ("truncated-weights", truncate_weights, "is damaged or not a safetensors file"),
    ("bit-flipped-weights", flip_a_weight_bit, "is damaged: its tensors do not match"),
    ("no-tokenizer", lambda run: shutil.rmtree(run / "tokenizer"), "missing meta.json"),
    ("damaged-tokenizer", flip_a_tokenizer_byte, "source.json is damaged"),
    ("config-other-d-model", other_d_model, "does not match the model built from the config"),
    ("no-weights", no_weights, "has no complete checkpoint (last/)"),
]


# `vaswani train --resume RUN ARGS` on a translation run: a resumed run continues exactly, so
# what would change its course is refused, named with its recorded and asked values
RESUME = [  # (id, arguments, expected in the message)
    ("resume-n-heads", ["--set", "model.n_heads=8"], "model.n_heads (2 -> 8)"),
    ("resume-dropout", ["--set", "model.dropout=0.3"], "model.dropout (0.1 -> 0.3)"),
    ("resume-seed", ["--set", "train.seed=7"], "train.seed (0 -> 7)"),
    ("resume-max-tokens", ["--set", "data.max_tokens=100"], "data.max_tokens (300 -> 100)"),
    ("resume-lr-and-batch", ["--set", "train.lr=0.1", "--set", "data.batch_size=9"],
     "data.batch_size (4 -> 9), train.lr (0.003 -> 0.1)"),
]


def negative_step(run: Path) -> None:
    path = run / "last" / "state.json"
    path.write_text(re.sub(r'"step": \d+', '"step": -1', path.read_text(), count=1))
