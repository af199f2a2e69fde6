"""The training loop: gradient accumulation, exact resume, DDP, crash-safe checkpoints."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.testing import assert_close

from tests.training.fixtures import config, reverse_task
from vaswani.config import load_run_config
from vaswani.data.datasets import build_dataset
from vaswani.training import checkpoint
from vaswani.training.loop import Trainer
from vaswani.training.run import resolve_model, train


def make_trainer(tmp_path, grad_accum):
    data = reverse_task(tmp_path / "pairs.tsv")
    cfg_path = config(tmp_path / f"c{grad_accum}.toml", "encoder-decoder", data,
                      train={"grad_accum": grad_accum, "label_smoothing": 0.1})
    cfg = load_run_config(cfg_path)
    ds = build_dataset(cfg.data, cfg.model.arch, cfg.model.max_len)
    cfg = resolve_model(cfg, ds)
    run = tmp_path / f"run{grad_accum}"
    run.mkdir()
    trainer = Trainer(cfg, ds, run, device=torch.device("cpu"), progress=False)
    trainer.model.double()
    return trainer, ds


def test_grad_accumulation_4x8_equals_one_batch_of_32(tmp_path):
    big, ds = make_trainer(tmp_path, 1)
    acc, _ = make_trainer(tmp_path, 4)
    examples = sorted(ds.train[:32], key=lambda e: len(e[1]))  # quarters differ in length
    loss_big, n_big = big.accumulate([big.task.to_device(big.task.collate(examples))])
    quarters = [acc.task.collate(examples[k * 8:(k + 1) * 8]) for k in range(4)]
    loss_acc, n_acc = acc.accumulate(quarters)
    assert n_big == n_acc  # non-pad target tokens of the whole step
    assert loss_big == pytest.approx(loss_acc, rel=1e-12)
    for (name, p), q in zip(big.model.named_parameters(), acc.model.parameters(), strict=True):
        assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-10, msg=name)
    big.optimizer_step()
    acc.optimizer_step()
    for p, q in zip(big.model.parameters(), acc.model.parameters(), strict=True):
        assert_close(p, q, rtol=0, atol=1e-5)


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}


def weights(run_dir: Path, which="last/model.safetensors"):
    return load_file(str(run_dir / which))


def test_resume_gives_the_same_losses_and_weights(tmp_path):
    data = reverse_task(tmp_path / "pairs.tsv")
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data, dropout=0.1)
    straight, halves = tmp_path / "straight", tmp_path / "halves"
    train(str(cfg), [], out=str(straight))
    train(str(cfg), ["train.max_steps=10"], out=str(halves))
    assert json.loads((halves / "last/state.json").read_text())["step"] == 10
    train(None, ["train.max_steps=20"], resume=str(halves))
    a, b = losses(straight), losses(halves)
    assert sorted(a) == sorted(b) == list(range(1, 21))
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-6, step
    wa, wb = weights(straight), weights(halves)
    for name in wa:
        assert_close(wa[name], wb[name], rtol=0, atol=1e-6)


def test_resume_refuses_other_data_and_missing_checkpoints(tmp_path):
    data = reverse_task(tmp_path / "pairs.tsv")
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data, train={"max_steps": 2})
    run = tmp_path / "run"
    train(str(cfg), [], out=str(run))
    reverse_task(data, seed=1)  # the file changes under the run
    with pytest.raises(ValueError, match="training data differs"):
        train(None, ["train.max_steps=4"], resume=str(run))
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        train(None, [], resume=str(tmp_path / "nothing"))
    with pytest.raises(FileExistsError, match="already holds a run"):
        train(str(cfg), [], out=str(run))


def test_a_kill_between_renames_leaves_a_loadable_checkpoint(tmp_path):
    model = torch.nn.Linear(3, 2)
    checkpoint.save_last(tmp_path, model, {"x": torch.ones(1)}, {"step": 1})
    # Simulate a kill after `last` was moved aside and before `last.tmp` took its place.
    os.replace(tmp_path / "last", tmp_path / "last.old")
    assert checkpoint.find_last(tmp_path) == tmp_path / "last.old"
    checkpoint.save_last(tmp_path, model, {"x": torch.ones(1)}, {"step": 2})
    (tmp_path / "last.tmp").mkdir()  # an incomplete write is never chosen
    assert checkpoint.find_last(tmp_path) == tmp_path / "last"
    _, state = checkpoint.load_last(tmp_path, model)
    assert state["step"] == 2


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "f.json"
    checkpoint.atomic_write_text(path, "old")

    def explode(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        checkpoint.atomic_write(path, explode)
    assert path.read_text() == "old"


def test_tied_and_compiled_names_load_back(tmp_path):
    from vaswani import ModelConfig, build_model

    model = build_model(ModelConfig(arch="decoder", vocab_size=11, d_model=8, n_heads=2,
                                    d_ff=16, n_layers=1))
    checkpoint.save_weights(model, tmp_path / "m.safetensors")
    stored = load_file(str(tmp_path / "m.safetensors"))
    assert "output_proj.weight" not in stored  # tied to embed.token.weight, stored once
    other = build_model(model.config)
    checkpoint.load_weights(other, tmp_path / "m.safetensors")
    assert other.output_proj.weight is other.embed.token.weight
    assert_close(other.output_proj.weight, model.output_proj.weight)
    from safetensors.torch import save_file
    save_file({f"_orig_mod.{k}": v for k, v in stored.items()}, str(tmp_path / "c.safetensors"))
    checkpoint.load_weights(build_model(model.config), tmp_path / "c.safetensors")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ddp_processes_equal_one_process_on_the_combined_batch(tmp_path):
    data = reverse_task(tmp_path / "pairs.tsv")
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data,
                 train={"max_steps": 6, "eval_every": 6, "save_every": 6})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single = subprocess.run([sys.executable, "-m", "vaswani", "train", str(cfg), "--out",
                             str(tmp_path / "one"), "--no-progress"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          "--master_addr=127.0.0.1", f"--master_port={free_port()}",
                          "-m", "vaswani", "train", str(cfg), "--out", str(tmp_path / "two"),
                          "--no-progress"], env=env, capture_output=True, text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-5
    wa, wb = weights(tmp_path / "one"), weights(tmp_path / "two")
    d = 32
    for name in wa:
        x, y = wa[name], wb[name]
        if name.endswith("in_proj.bias"):
            # The key bias [d:2d] has an exactly zero gradient (softmax ignores a constant
            # shift of the scores), so Adam turns roundoff noise into lr-sized steps there in
            # both runs; see test_key_bias_gradient_is_zero. Compare the query and value biases.
            x, y = torch.cat([x[:d], x[2 * d:]]), torch.cat([y[:d], y[2 * d:]])
        assert_close(x, y, rtol=0, atol=1e-5, msg=name)


def test_key_bias_gradient_is_zero():
    from vaswani.nn import MultiHeadAttention

    mha = MultiHeadAttention(16, 4).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    mha(x)[0].pow(2).sum().backward()
    grad = mha.in_proj.bias.grad
    assert grad[16:32].abs().max() < 1e-12 < grad[:16].abs().max()
