"""The training loop: gradient accumulation, exact resume, DDP, crash-safe checkpoints."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.testing import assert_close

from tests import conftest
from tests.training.fixtures import (
    classification_file,
    config,
    cpu_config,
    reverse_task,
    text_file,
    train_in_one_and_two_processes,
)
from vaswani.config import load_run_config
from vaswani.tasks import task_for
from vaswani.training.loop import Trainer
from vaswani.training.train import Launch, resolve_model, train


def make_trainer(tmp_path, grad_accum, arch="encoder-decoder", device=None):
    make, name = {"encoder-decoder": (reverse_task, "pairs.tsv"), "decoder": (text_file, "a.txt"),
                  "encoder": (classification_file, "labels.tsv")}[arch]
    data = make(tmp_path / name)
    cfg_path = config(tmp_path / f"c{grad_accum}.toml", arch, data,
                      train={"grad_accum": grad_accum, "label_smoothing": 0.1})
    cfg = load_run_config(cfg_path)
    task = task_for(cfg)
    ds = task.load(tmp_path / "cache")
    cfg = resolve_model(cfg, task, ds)
    run = tmp_path / f"run{grad_accum}"
    run.mkdir()
    trainer = Trainer(cfg, task_for(cfg), ds, run, device=device or torch.device("cpu"),
                      progress=False)
    trainer.model.double()
    return trainer, ds


def test_grad_accumulation_4x8_equals_one_batch_of_32(tmp_path):
    big, ds = make_trainer(tmp_path, 1)
    acc, _ = make_trainer(tmp_path, 4)
    examples = sorted(ds.train[:32], key=lambda e: len(e[1]))  # quarters differ in length
    loss_big, n_big = big.accumulate([big.task.collate(examples)])
    quarters = [acc.task.collate(examples[k * 8:(k + 1) * 8]) for k in range(4)]
    loss_acc, n_acc = acc.accumulate(quarters)
    assert n_big == n_acc  # non-pad target tokens of the whole step
    assert float(loss_big) == pytest.approx(float(loss_acc), rel=1e-12)
    for (name, p), q in zip(big.model.named_parameters(), acc.model.parameters(), strict=True):
        assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-10, msg=name)
    big.optimizer_step()
    acc.optimizer_step()
    for p, q in zip(big.model.parameters(), acc.model.parameters(), strict=True):
        assert_close(p, q, rtol=0, atol=1e-5)



@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder", "encoder"])
def test_a_step_never_reads_the_device_and_skips_a_nan_on_the_device(tmp_path, monkeypatch,
                                                                    arch):
    """No tensor is read back to the host inside a training step (on a GPU each read waits
    for the step's kernels), a NaN loss among them included: the optimizer skips that update
    itself, and the skip is counted on the device and read by settle(). On CUDA the
    device's own sync check (``set_sync_debug_mode("error")``) watches too."""
    trainer, _ = make_trainer(tmp_path, 2, arch, conftest.DEVICE)
    real_loss, calls = type(trainer.task).loss, {"n": 0}

    def loss(self, model, batch, smoothing):
        calls["n"] += 1
        out = real_loss(self, model, batch, smoothing)
        return (out[0] * float("nan"), *out[1:]) if calls["n"] in (3, 4) else out

    monkeypatch.setattr(type(trainer.task), "loss", loss)
    # the batches are made on the host (numpy and CPU tensors) before they meet the device
    made = {i: trainer.batches.micro_batch(i) for i in range(6)}
    monkeypatch.setattr(trainer.batches, "micro_batch", made.__getitem__)

    def read(*_):
        raise AssertionError("a tensor was read back to the host inside a training step")

    cuda = trainer.device.type == "cuda"
    weights = []
    for _ in range(3):
        with monkeypatch.context() as m:
            for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
                m.setattr(torch.Tensor, name, read)
            if cuda:
                torch.cuda.set_sync_debug_mode("error")
            try:
                trainer.train_step()
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
        weights.append([p.detach().clone() for p in trainer.model.parameters()])
    assert trainer.state.skipped == 0  # not read yet
    trainer.settle()
    assert trainer.state.skipped == 1 and trainer.state.step == 3
    # step 2 (micro-batches 3 and 4) changed nothing, steps 1 and 3 did
    assert all(torch.equal(a, b) for a, b in zip(weights[0], weights[1], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(weights[1], weights[2], strict=True))
    assert trainer.optimizer.state[next(trainer.model.parameters())]["step"] == 2

def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows}


def weights(run_dir: Path, which="last/model.safetensors"):
    return load_file(str(run_dir / which))


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_resume_gives_the_same_losses_and_weights(tmp_path, optimizer):
    data = reverse_task(tmp_path / "pairs.tsv")
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data, dropout=0.1,
                 train={"optimizer": optimizer})
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


def test_two_ddp_processes_equal_one_process_on_the_combined_batch(tmp_path):
    data = reverse_task(tmp_path / "pairs.tsv")
    cfg = cpu_config(tmp_path / "c.toml", "encoder-decoder", data,
                 train={"max_steps": 6, "eval_every": 6, "save_every": 6})
    train_in_one_and_two_processes(cfg, tmp_path)
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
    from vaswani.nn import Heads, MultiHeadAttention

    mha = MultiHeadAttention(Heads(16, 4)).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    mha(x)[0].pow(2).sum().backward()
    grad = mha.in_proj.bias.grad
    assert grad[16:32].abs().max() < 1e-12 < grad[:16].abs().max()


def run_losses(tmp_path, name, dropout=0.0, **train_options):
    data = text_file(tmp_path / "t.txt")
    cfg = config(tmp_path / f"{name}.toml", "decoder", data, dropout=dropout,
                 train={"max_steps": 4, "eval_every": 4, **train_options})
    train(str(cfg), [], out=str(tmp_path / name), launch=Launch(progress=False))
    return losses(tmp_path / name)


def test_the_train_command_keeps_freed_memory_and_the_library_leaves_it_alone(tmp_path,
                                                                             monkeypatch):
    """`vaswani train` owns its process and asks malloc to keep freed memory
    (tests/test_devices.py); the library's train() leaves the process's malloc as it was."""
    from vaswani.cli import main

    calls = []
    monkeypatch.setattr("vaswani.cli.keep_freed_memory", lambda: calls.append(1) or True)
    run_losses(tmp_path, "library")
    assert calls == []
    cfg = config(tmp_path / "cli.toml", "decoder", text_file(tmp_path / "t.txt"),
                 train={"max_steps": 2, "eval_every": 2})
    assert main(["train", str(cfg), "--out", str(tmp_path / "cli"), "--no-progress"]) == 0
    assert calls == [1]


def test_bf16_autocast_tracks_fp32(tmp_path, monkeypatch):
    monkeypatch.setattr("vaswani.devices.bf16_is_fast", lambda device: True)  # even emulated
    fp32 = run_losses(tmp_path, "fp32")
    bf16 = run_losses(tmp_path, "bf16", bf16=True)
    assert "bf16 = true" in (tmp_path / "bf16/config.toml").read_text()
    for step in fp32:
        assert bf16[step] == pytest.approx(fp32[step], rel=0.02)
    assert any(bf16[step] != fp32[step] for step in fp32)  # bf16 did run


def test_bf16_without_native_support_trains_in_fp32_and_says_so(tmp_path, monkeypatch,
                                                                 capsys):
    monkeypatch.setattr("vaswani.devices.bf16_is_fast", lambda device: False)
    fp32 = run_losses(tmp_path, "fp32")
    asked = run_losses(tmp_path, "asked", bf16=True)
    assert "has no native bfloat16" in capsys.readouterr().err
    assert "bf16 = false" in (tmp_path / "asked/config.toml").read_text()
    assert asked == fp32


def test_precision_fp16_trains_with_a_gradient_scaler_and_resumes_exactly(tmp_path,
                                                                         monkeypatch):
    """fp16 autocast (allowed here on the CPU, which emulates it): the loss tracks fp32, the
    scaler's state is saved in last/ and a resumed run equals a straight one."""
    monkeypatch.setattr("vaswani.devices.usable_precision", lambda asked, device, say: asked)
    fp32 = run_losses(tmp_path, "fp32")
    fp16 = run_losses(tmp_path, "fp16", precision="fp16")
    assert 'precision = "fp16"' in (tmp_path / "fp16/config.toml").read_text()
    for step in fp32:
        assert fp16[step] == pytest.approx(fp32[step], rel=0.02)
    assert any(fp16[step] != fp32[step] for step in fp32)  # fp16 did run
    state = torch.load(tmp_path / "fp16/last/trainer.pt", weights_only=True)
    assert state["grad_scaler"]["scale"] > 1  # the scaler ran and its scale was kept

    data = text_file(tmp_path / "t.txt")
    cfg = config(tmp_path / "half.toml", "decoder", data,
                 train={"max_steps": 4, "eval_every": 4, "save_every": 2,
                        "precision": "fp16"})
    train(str(cfg), ["train.max_steps=2"], out=str(tmp_path / "half"),
          launch=Launch(progress=False))
    train(None, ["train.max_steps=4"], resume=str(tmp_path / "half"),
          launch=Launch(progress=False))
    assert losses(tmp_path / "half") == fp16
    for name, w in weights(tmp_path / "fp16").items():
        assert torch.equal(w, weights(tmp_path / "half")[name]), name


def test_the_older_bf16_key_still_means_precision_bf16(tmp_path, monkeypatch):
    monkeypatch.setattr("vaswani.devices.bf16_is_fast", lambda device: True)
    old = run_losses(tmp_path, "old", bf16=True)
    new = run_losses(tmp_path, "new", precision="bf16")
    assert old == new
    text = (tmp_path / "new/config.toml").read_text()
    assert 'precision = "bf16"' in text and "bf16 = true" in text


def test_fp16_on_a_cpu_trains_in_fp32_and_says_so(tmp_path, capsys):
    fp32 = run_losses(tmp_path, "fp32", device="cpu")
    asked = run_losses(tmp_path, "asked", precision="fp16", device="cpu")
    assert "is not a CUDA GPU" in capsys.readouterr().err
    assert 'precision = "fp32"' in (tmp_path / "asked/config.toml").read_text()
    assert asked == fp32


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_compiled_training_matches_eager(tmp_path, monkeypatch, arch):
    """A compiled step trains as the eager one does: the model compiled, and the loss by the
    compiled criterion wherever the logits are made (not for a language model on a CPU, whose
    vocabulary projection and loss run together chunk by chunk, compiled with the model)."""
    from vaswani.models import losses as loss_module

    compiled_loss, rows = loss_module.compiled_smoothed_cross_entropy, []
    monkeypatch.setattr(loss_module, "compiled_smoothed_cross_entropy",
                        lambda logits, *a, **k: rows.append(len(logits)) or
                        compiled_loss(logits, *a, **k))
    data = text_file(tmp_path / "t.txt") if arch == "decoder" else \
        reverse_task(tmp_path / "pairs.tsv")

    def run(name, **options):
        cfg = config(tmp_path / f"{name}.toml", arch, data,
                     train={"max_steps": 3, "eval_every": 3, **options})
        train(str(cfg), [], out=str(tmp_path / name), launch=Launch(progress=False))
        return losses(tmp_path / name)

    eager = run("eager")
    assert rows == []
    compiled = run("compiled", compile=True)
    chunked = arch == "decoder" and conftest.DEVICE.type == "cpu"
    assert rows == [] if chunked else len(rows) >= 3  # a batch a step, and validation's
    for step in eager:
        assert compiled[step] == pytest.approx(eager[step], rel=1e-4)
    # weights saved from a compiled model carry no "_orig_mod." prefix
    assert not any("_orig_mod" in k for k in weights(tmp_path / "compiled"))


def test_early_stopping_and_keep_best(tmp_path):
    data = reverse_task(tmp_path / "pairs.tsv")
    # A learning rate this small cannot improve the validation loss: evaluation 2 is no
    # better than evaluation 1, so with patience 1 training stops at step 10.
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data,
                 train={"max_steps": 100, "eval_every": 5, "save_every": 100, "lr": 1e-12,
                        "patience": 1, "schedule": "constant", "warmup": 0})
    summary = train(str(cfg), [], out=str(tmp_path / "run"), launch=Launch(progress=False))
    assert summary["steps"] == 10
    state = json.loads((tmp_path / "run/last/state.json").read_text())
    assert state["step"] == 10 and state["bad_evals"] == 1
    evals = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()
             if "valid_loss" in x]
    assert state["best"] == min(e["valid_loss"] for e in evals) == evals[0]["valid_loss"]
    assert (tmp_path / "run/model.safetensors").exists()


def test_best_weights_follow_the_best_metric(tmp_path):
    data = reverse_task(tmp_path / "pairs.tsv")
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data,
                 train={"max_steps": 10, "eval_every": 5, "best_metric": "chrf"})
    train(str(cfg), [], out=str(tmp_path / "run"), launch=Launch(progress=False))
    state = json.loads((tmp_path / "run/last/state.json").read_text())
    evals = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()
             if "chrf" in x]
    assert state["best"] == max(e["chrf"] for e in evals)
    with pytest.raises(ValueError, match=r"best_metric \('accuracy'\) must be one of"):
        train(str(cfg), ["train.best_metric=accuracy"], out=str(tmp_path / "other"))


def test_max_minutes_stops_evaluates_and_saves(tmp_path):
    data = reverse_task(tmp_path / "pairs.tsv")
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data,
                 train={"max_steps": 1_000_000, "eval_every": 1_000_000,
                        "save_every": 1_000_000, "max_minutes": 0.05})  # 3 seconds
    summary = train(str(cfg), [], out=str(tmp_path / "run"), launch=Launch(progress=False))
    assert 0 < summary["steps"] < 1_000_000 and "valid_loss" in summary
    state = json.loads((tmp_path / "run/last/state.json").read_text())
    assert state["step"] == summary["steps"] and 3 <= state["elapsed"] < 60
    last = json.loads((tmp_path / "run/metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == summary["steps"] and "valid_loss" in last and last["elapsed"] >= 3


def test_an_optimizer_state_of_another_model_is_refused_not_loaded():
    """The fused AdamW kernel trusts shapes; a state saved for parameters of other shapes must
    be an error before it is loaded (loading it corrupted memory). So is an AdamW state
    loaded into a Muon run."""
    from vaswani import ModelConfig, build_model
    from vaswani.config import TrainConfig
    from vaswani.training.optimizers import make_optimizer

    def stepped(d_ff, optimizer="adamw"):
        model = build_model(ModelConfig(arch="decoder", vocab_size=11, d_model=8, n_heads=2,
                                        d_ff=d_ff, n_layers=1))
        opt = make_optimizer(model, TrainConfig(optimizer=optimizer))
        model(torch.randint(1, 11, (2, 5))).sum().backward()
        opt.step()
        return model, opt

    model, opt = stepped(16)
    opt.load_state_dict(opt.state_dict(), model, Path("here"))  # its own state fits
    other, other_opt = stepped(24)
    with pytest.raises(ValueError, match=r"here: the saved optimizer state's exp_avg for "
                                         r"decoder.layers.0.feed_forward.linear1.weight"):
        other_opt.load_state_dict(opt.state_dict(), other, Path("here"))
    muon_model, muon_opt = stepped(16, "muon")
    muon_opt.load_state_dict(muon_opt.state_dict(), muon_model, Path("here"))
    with pytest.raises(ValueError, match=r"here: the saved optimizer state is for adamw, this "
                                         r"run's \[train\] optimizer uses adamw \+ muon"):
        muon_opt.load_state_dict(opt.state_dict(), muon_model, Path("here"))


def test_muon_takes_the_layers_matrices_and_adamw_the_rest():
    """The modded-nanoGPT split: Muon for the attention and feed-forward weights, AdamW for
    embeddings (and the head tied to them), norms and biases, each at its own rate."""
    from vaswani import ModelConfig, build_model
    from vaswani.config import TrainConfig
    from vaswani.training.optimizers import make_optimizer

    model = build_model(ModelConfig(arch="encoder-decoder", vocab_size=11, d_model=8,
                                    n_heads=2, d_ff=16, n_layers=1))
    opt = make_optimizer(model, TrainConfig(optimizer="muon", lr=1e-3, muon_lr=0.05))
    names = {id(p): n for n, p in model.named_parameters()}
    muon, adamw = (opt.parts[k][0] for k in ("muon", "adamw"))
    in_muon = sorted(names[id(p)] for g in muon.param_groups for p in g["params"])
    in_adamw = sorted(names[id(p)] for g in adamw.param_groups for p in g["params"])
    assert in_muon == sorted(n for n, p in model.named_parameters()
                             if ".layers." in n and n.endswith("weight") and p.dim() == 2)
    assert len(in_muon) == 10  # q/k/v, out, two feed-forward: 4 in the encoder, 6 decoder
    assert set(in_muon).isdisjoint(in_adamw)
    assert set(in_muon) | set(in_adamw) == set(names.values())
    assert "src_embed.token.weight" in in_adamw
    opt.set_lr(0.5)
    assert [g["lr"] for g in muon.param_groups] == [0.025]
    assert {g["lr"] for g in adamw.param_groups} == {5e-4}

def test_keep_checkpoints_writes_the_average_at_the_end(tmp_path):
    from vaswani import checkpoint, load, rundir

    data = reverse_task(tmp_path / "pairs.tsv")
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data,
                 train={"max_steps": 30, "save_every": 10, "keep_checkpoints": 2})
    summary = train(str(cfg), [], out=str(tmp_path / "run"), launch=Launch(progress=False))
    run_dir = tmp_path / "run"
    assert "2 checkpoints" in summary["averaged"]
    kept = checkpoint.list_checkpoints(run_dir)
    assert [p.stem for p in kept] == ["step-000020", "step-000030"]
    a, b = (load_file(str(p)) for p in kept)
    averaged = load_file(str(run_dir / rundir.AVERAGED))
    for name in averaged:
        assert torch.equal(averaged[name], ((a[name].double() + b[name].double()) / 2).float())
    run = load(run_dir, weights="averaged")  # loads into the model
    assert run.translate(["abc"])


def test_activation_checkpointing_gives_the_same_gradients_with_dropout():
    """Each layer's activations recomputed in the backward pass, dropout replayed from the
    same random state: gradients equal to keeping them (encoder-decoder and decoder)."""
    from vaswani import ModelConfig, build_model
    from vaswani.nn.layers import Stack

    for arch in ("encoder-decoder", "decoder"):
        grads = []
        for recompute in (False, True):
            torch.manual_seed(0)
            model = build_model(ModelConfig(arch=arch, vocab_size=30, d_model=32, n_heads=4,
                                            d_ff=64, n_layers=2, dropout=0.3)).double().train()
            stacks = [m for m in model.modules() if isinstance(m, Stack)]
            for stack in stacks:
                stack.checkpoint_activations = recompute
            torch.manual_seed(1)
            ids = torch.randint(4, 30, (3, 9))
            out = model(ids, ids) if arch == "encoder-decoder" else model(ids)
            out.square().mean().backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        assert grads[0].keys() == grads[1].keys()
        for name in grads[0]:
            assert_close(grads[1][name], grads[0][name], rtol=0, atol=1e-12, msg=name)


def test_training_with_checkpoint_activations_equals_training_without(tmp_path):
    plain = run_losses(tmp_path, "plain", dropout=0.1)
    recomputed = run_losses(tmp_path, "recomputed", dropout=0.1, checkpoint_activations=True)
    assert recomputed == pytest.approx(plain, rel=1e-6)


def test_tensorboard_events_hold_what_metrics_jsonl_holds_and_resume_drops_the_rest(
        tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = text_file(tmp_path / "t.txt")
    cfg = config(tmp_path / "tb.toml", "decoder", data,
                 train={"max_steps": 6, "eval_every": 3, "save_every": 3, "tensorboard": True})
    run = tmp_path / "tb"
    train(str(cfg), ["train.max_steps=3"], out=str(run), launch=Launch(progress=False))
    assert f"tensorboard --logdir {run / 'tensorboard'}" in capsys.readouterr().err
    train(None, ["train.max_steps=6"], resume=str(run), launch=Launch(progress=False))
    board = EventAccumulator(str(run / "tensorboard"))
    board.Reload()
    tags = board.Tags()["scalars"]
    for tag in ["train/loss", "train/lr", "train/tokens_per_s", "train/grad_norm",
                "valid/valid_loss", "memory/peak_mib_rank0"]:
        assert tag in tags, (tag, tags)
    logged = {e.step: e.value for e in board.Scalars("train/loss")}
    assert logged == pytest.approx(losses(run), rel=1e-6)  # steps 1-6, each once
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(r["grad_norm"] > 0 and len(r["peak_memory_mib"]) == 1 for r in rows)


def test_compile_auto_compiles_on_a_gpu_only_and_reads_back_from_older_runs():
    """[train] compile = "auto" (the default): on CUDA, where compiling fuses a step's many
    small kernels; not on a CPU, where the compiled step is slower. true and false as given;
    a config.toml written before "auto" existed (compile = false) reads back as it was."""
    from vaswani.config import TrainConfig

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert TrainConfig().compile == "auto"
    assert (TrainConfig().compiles(cpu), TrainConfig().compiles(cuda)) == (False, True)
    assert TrainConfig(compile=True).compiles(cpu) and not TrainConfig(compile=False).compiles(cuda)
    with pytest.raises(ValueError, match="compile"):
        TrainConfig(compile="sometimes")
    from vaswani.config import RunConfig, apply_overrides

    cfg = RunConfig.from_dict(apply_overrides({"train": {"compile": False}},
                                              ["train.compile=auto"]))
    assert cfg.train.compile == "auto"
    assert 'compile = "auto"' in cfg.to_toml()


def test_batch_tokens_sets_the_accumulation_a_step_needs(tmp_path):
    """[data] batch_tokens (the paper's ~25,000 tokens a step) over micro-batches of
    max_tokens: grad_accum = ceil(1,000 / 300) = 4, written to config.toml, so that a resumed
    run keeps it; given beside grad_accum, it is refused by name."""
    data = reverse_task(tmp_path / "pairs.tsv", n=200)
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data,
                 train={"max_steps": 2, "eval_every": 2})
    train(str(cfg), ["data.batch_tokens=1000", "data.max_tokens=300"],
          out=str(tmp_path / "run"), launch=Launch(progress=False))
    assert "grad_accum = 4" in (tmp_path / "run" / "config.toml").read_text()
    with pytest.raises(ValueError, match=r"batch_tokens \(1000\) sets grad_accum"):
        train(str(cfg), ["data.batch_tokens=1000", "train.grad_accum=2"],
              out=str(tmp_path / "two"), launch=Launch(progress=False))


def test_a_mixture_of_experts_trains_alike_in_two_ddp_processes(tmp_path):
    """A language model whose feed-forward blocks are sixteen experts, one a token: two DDP
    processes (each step, some expert no token of a rank chose: its gradient there is zero,
    not missing) give one process's losses and weights. The load-balancing loss is each
    micro-batch's own, as transformers computes it per forward, so it is off here: over the
    combined batch it is not the sum of the halves'."""
    data = text_file(tmp_path / "text.txt", n=600)
    cfg = cpu_config(tmp_path / "c.toml", "decoder", data,  # 16 experts, 8 tokens a rank
                     model={"experts": {"count": 16, "per_token": 1, "d_ff": 8, "aux_loss": 0.0},
                            "activation": "swiglu", "norm_first": True, "bias": False},
                     data={"batch_size": 2, "block_size": 8},
                     train={"max_steps": 4, "eval_every": 4, "save_every": 4})
    train_in_one_and_two_processes(cfg, tmp_path)
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert a.keys() == b.keys() and len(a) == 4
    for step in a:
        assert abs(a[step] - b[step]) <= 1e-5
    wa, wb = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert any(".experts.15." in name for name in wa)
    for name in wa:
        assert_close(wa[name], wb[name], rtol=0, atol=1e-5, msg=name)
