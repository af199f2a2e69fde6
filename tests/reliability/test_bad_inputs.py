"""Bad inputs, as a new user or an adversary would give them: each is a one-line error (exit
status 2, no traceback), and a bad training input touches no run directory. The tables of
cases.py are tests/reliability/probe.py's too, which gives them to the command line."""

import shutil
from pathlib import Path

import pytest
import torch

from tests.reliability.cases import DAMAGE, INFERENCE, RESUME, RUN_OF, TRAINING, negative_step
from tests.reliability.checkpoints import bert_folder, llama_gguf
from tests.training.fixtures import config, reverse_task, text_file
from vaswani.cli import main

LEGACY = Path(__file__).resolve().parents[1] / "fixtures" / "legacy"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Scratch copies of small trained runs (one per family, with their data), and "fresh",
    a translation run written by today's code (with checksums; the legacy ones have none)."""
    from vaswani.training.train import Launch, train

    base = tmp_path_factory.mktemp("bad-inputs")
    shutil.copytree(LEGACY, base, dirs_exist_ok=True)
    train(str(base / "translation.toml"), ["train.max_steps=2", "data.train=" +
                                           str(base / "data" / "pairs.tsv")],
          out=str(base / "fresh"), launch=Launch(progress=False))
    return base


def one_line_error(capsys, code: int = 2) -> str:
    captured = capsys.readouterr()
    lines = [x for x in captured.err.splitlines() if x.strip()]
    assert "Traceback" not in captured.err, captured.err
    assert lines and lines[-1].startswith("vaswani: error: "), captured.err
    return lines[-1]


@pytest.mark.parametrize("name, arch, args, message", INFERENCE, ids=[c[0] for c in INFERENCE])
def test_bad_inference_inputs(runs, capsys, monkeypatch, name, arch, args, message):
    monkeypatch.chdir(runs)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("abc\n"))
    assert main([args[0], RUN_OF[arch], *args[1:]]) == 2
    assert message in one_line_error(capsys)


@pytest.mark.parametrize("args, message", [
    (["embed", "classifier", "--batch-size", "0"], "--batch-size: '0' is not a whole number"),
    (["serve", "lm", "--port", "-1"], "port (-1) must be a number in 1-65535"),
    (["serve", "lm", "--port", "70000"], "port (70000) must be a number in 1-65535"),
])
def test_bad_numbers_are_usage_errors(runs, capsys, monkeypatch, args, message):
    monkeypatch.chdir(runs)
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_generate_prints_nothing_before_a_refusal_and_warns_on_a_long_prompt(runs, capsys,
                                                                            monkeypatch):
    monkeypatch.chdir(runs)
    assert main(["generate", "lm", "--prompt", "to be", "--temperature", "-1"]) == 2
    assert capsys.readouterr().out == ""  # not the prompt, then an error
    import vaswani

    max_len = vaswani.load(runs / "lm").config.model.max_len
    long = "to be or not " * max_len
    assert main(["generate", "lm", "--prompt", long, "--max-new-tokens", "3"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(long)
    assert "longer than the model's max_len" in captured.err


def test_cuda_on_a_machine_without_it(runs, capsys, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --device cuda is not an error here")
    monkeypatch.chdir(runs)
    assert main(["translate", "translation", "--device", "cuda"]) == 2
    assert "this PyTorch sees no CUDA device" in one_line_error(capsys)


def damaged_copy(runs: Path, tmp_path: Path, name: str, damage) -> Path:
    run = tmp_path / name
    shutil.copytree(runs / name, run)
    damage(run)
    return run


@pytest.mark.parametrize("name, damage, message", DAMAGE, ids=[c[0] for c in DAMAGE])
def test_damaged_run_directories(runs, tmp_path, capsys, monkeypatch, name, damage, message):
    run = damaged_copy(runs, tmp_path, "fresh", damage)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("abc\n"))
    assert main(["translate", str(run)]) == 2
    assert message in one_line_error(capsys)


def test_a_damaged_trainer_state_refuses_resume(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(runs)
    run = damaged_copy(runs, tmp_path, "fresh", lambda run: None)
    state = run / "last" / "trainer.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x10
    state.write_bytes(bytes(data))
    assert main(["train", "--resume", str(run), "--set", "train.max_steps=3"]) == 2
    assert "trainer.pt is damaged" in one_line_error(capsys)


@pytest.mark.parametrize("name, args, message", RESUME, ids=[c[0] for c in RESUME])
def test_a_resume_that_would_change_the_run_is_refused(runs, tmp_path, capsys, monkeypatch,
                                                       name, args, message):
    monkeypatch.chdir(runs)
    run = damaged_copy(runs, tmp_path, "fresh", lambda run: None)
    config = (run / "config.toml").read_bytes()
    assert main(["train", "--resume", str(run), "--set", "train.max_steps=3", *args]) == 2
    assert message in one_line_error(capsys)
    assert (run / "config.toml").read_bytes() == config
    # what does not change the course is allowed: length, evaluation, logging, decoding
    assert main(["train", "--resume", str(run), "--no-progress", "--set", "train.max_steps=3",
                 "--set", "train.eval_every=1", "--set", "train.log_every=2", "--set",
                 "decode.beam=2", "--set", "model.n_heads=2"]) == 0


def test_a_negative_step_in_state_json_is_named(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(runs)
    run = damaged_copy(runs, tmp_path, "fresh", negative_step)
    assert main(["train", "--resume", str(run), "--set", "train.max_steps=3"]) == 2
    assert "state.json is damaged: step (-1) must be a whole number >= 0" in \
        one_line_error(capsys)


GGUF = [
    ("random-bytes", lambda p: p.write_bytes(bytes(range(256)) * 8), "not a readable GGUF"),
    ("truncated", lambda p: p.write_bytes(llama_gguf(p).read_bytes()[:2000]),
     "not a readable GGUF"),
    ("missing-key", lambda p: llama_gguf(p, skip=("embedding_length",)),
     "lacks the GGUF key 'llama.embedding_length'"),
    ("wrong-tensor-size", lambda p: llama_gguf(p, wrong_shape="blk.0.ffn_up.weight"),
     "model.layers.0.mlp.up_proj.weight has shape (33, 16), but the config's sizes give "
     "(32, 16)"),
    # metadata that would have the model allocate gigabytes before any check
    ("feed-forward-2^26", lambda p: llama_gguf(p, metadata={"feed_forward_length": 2 ** 26}),
     "gate_proj.weight has shape (32, 16), but the config's sizes give (67108864, 16)"),
    ("embedding-2^20", lambda p: llama_gguf(p, metadata={"embedding_length": 2 ** 20}),
     "embed_tokens.weight has shape (30, 16), but the config's sizes give (30, 1048576)"),
    ("layers-2^20", lambda p: llama_gguf(p, metadata={"block_count": 2 ** 20}),
     "lacks the tensor for 'model.layers.1."),
]


@pytest.mark.parametrize("name, make, message", GGUF, ids=[c[0] for c in GGUF])
def test_bad_gguf_files(tmp_path, capsys, name, make, message):
    from tests.conftest import restart_peak
    from vaswani.devices import peak_resident_bytes

    path = tmp_path / "m.gguf"
    make(path)
    out = tmp_path / "out"
    before = restart_peak()
    assert main(["import", "gguf", str(path), "--out", str(out), "--cache",
                 str(tmp_path / "cache")]) == 2
    assert message in one_line_error(capsys)
    assert not out.exists()
    # refused before allocating: the peak resident memory grew by less than 200 MiB
    assert peak_resident_bytes() - before < 200 * 2**20


def test_bad_bert_sources(tmp_path, capsys):
    file = tmp_path / "file.txt"
    file.write_text("x")
    assert main(["import", "bert", str(file), "--out", str(tmp_path / "o")]) == 2
    assert "is not a folder" in one_line_error(capsys)
    folder = bert_folder(tmp_path / "bert")
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    assert main(["import", "bert", str(folder), "--out", str(tmp_path / "o")]) == 2
    assert "holds an unreadable BERT checkpoint" in one_line_error(capsys)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("key, value, message", [
    ("intermediate_size", 2 ** 26, "does not fit its own config"),
    ("hidden_size", 2 ** 20, "hidden_size is 1048576, but the weights' "
                             "embeddings.word_embeddings.weight has shape (30, 16)"),
    ("max_position_embeddings", 2 ** 30, "does not fit its own config")])
def test_bert_config_that_disagrees_with_its_tensors_is_refused_before_allocating(
        tmp_path, capsys, key, value, message):
    import json
    import resource

    folder = bert_folder(tmp_path / "bert")
    hf = json.loads((folder / "config.json").read_text())
    hf[key] = value
    (folder / "config.json").write_text(json.dumps(hf))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert main(["import", "bert", str(folder), "--out", str(tmp_path / "o")]) == 2
    assert message in one_line_error(capsys)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024
    assert not (tmp_path / "o").exists()


@pytest.fixture()
def train_files(tmp_path):
    data = reverse_task(tmp_path / "pairs.tsv", n=60)
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data, train={"max_steps": 2})
    return cfg, tmp_path


TRAINING_HERE = [*TRAINING, ("cache-is-a-file", ["--cache", "{cfg}"],
                                "is a file, not a directory")]


@pytest.mark.parametrize("name, extra, message", TRAINING_HERE,
                         ids=[c[0] for c in TRAINING_HERE])
def test_bad_training_inputs_touch_nothing(train_files, capsys, name, extra, message):
    cfg, tmp = train_files
    extra = [x.format(dir=tmp, cfg=cfg) for x in extra]
    out = tmp / "run"
    assert main(["train", str(cfg), "--out", str(out), "--no-progress", *extra]) == 2
    assert message in one_line_error(capsys)
    assert not out.exists()


def test_bad_config_files(tmp_path, capsys):
    cases = {
        "a directory": (tmp_path, "is a directory, not a config file"),
        "a number for a section": ("model = 5\n", "[model] must be a section"),
        "not UTF-8": (b"[model]\narch = '\xff'\n", "not a UTF-8 text file"),
        "bad syntax": ("[model\n", "invalid TOML"),
    }
    for name, (content, message) in cases.items():
        if isinstance(content, Path):
            path = content
        else:
            path = tmp_path / f"{name}.toml"
            (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        assert main(["train", str(path), "--out", str(tmp_path / "run")]) == 2, name
        assert message in one_line_error(capsys), name


def test_a_block_longer_than_the_model_is_refused(tmp_path, capsys):
    cfg = config(tmp_path / "c.toml", "decoder", text_file(tmp_path / "t.txt"),
                 data={"block_size": 128})
    assert main(["train", str(cfg), "--out", str(tmp_path / "run")]) == 2
    assert "block_size (128) must be at most [model] max_len (64)" in one_line_error(capsys)


def test_a_read_only_cache(train_files, capsys, monkeypatch):
    """A cache the user cannot write (as root, permissions are not enforced, so the denial is
    simulated where the cache is created)."""
    cfg, tmp = train_files
    real_mkdir = Path.mkdir

    def denied(self, *args, **kwargs):
        if "ro-cache" in str(self):
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", denied)
    assert main(["data", "prepare", "copy", "--cache", str(tmp / "ro-cache")]) == 2
    assert "Permission denied" in one_line_error(capsys)


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_extending_past_the_end_of_a_decaying_schedule(schedule, tmp_path, capsys):
    data = reverse_task(tmp_path / "p.tsv", n=60)
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data,
                 train={"max_steps": 2, "schedule": schedule, "warmup": 1})
    run = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--set", "train.max_steps=4"]) == 2
    error = one_line_error(capsys)
    assert f"end of this run's {schedule} schedule" in error
    assert "--set train.schedule_steps=4 to stretch" in error
    assert main(["train", "--resume", str(run), "--no-progress", "--set", "train.max_steps=4",
                 "--set", "train.schedule_steps=4"]) == 0


def test_a_batch_size_below_one_is_refused_by_the_library(runs):
    """Not one text at a time in silence (translate ran one row, classify failed in range)."""
    import vaswani

    with pytest.raises(ValueError, match=r"batch_size \(0\) must be >= 1"):
        vaswani.load(runs / "translation").translate(["abc"], batch_size=0)
    with pytest.raises(ValueError, match=r"batch_size \(-1\) must be >= 1"):
        vaswani.load(runs / "classifier").classify(["a b"], batch_size=-1)
