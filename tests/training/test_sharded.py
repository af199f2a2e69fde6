"""[train] parallel = "fsdp": sharded training on two CPU processes (gloo), its sharded
checkpoints (DCP), resuming on another number of processes, and a save killed part-way."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.testing import assert_close

from tests import processes
from tests.processes import free_port
from tests.training.fixtures import classification_file, reverse_task
from tests.training.fixtures import cpu_config as config  # several processes
from tests.training.test_trainer import losses
from vaswani.training.train import Launch, train

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
STEPS = 6


def vaswani(*args: str, nproc: int = 1, script: str | None = None, env: dict | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    """``vaswani ARGS`` in a subprocess: one process, or ``nproc`` under torchrun."""
    main = [script] if script else ["-m", "vaswani"]
    launcher = [] if nproc == 1 and not script else [
        "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
        f"--master_port={free_port()}"]
    done = processes.run([sys.executable, *launcher, *main, *args, "--no-progress"],
                         env={**ENV, **(env or {})}, timeout=300)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One config, and a straight 6-step run of it in one unsharded process."""
    tmp = tmp_path_factory.mktemp("sharded")
    data = reverse_task(tmp / "pairs.tsv")
    cfg = config(tmp / "c.toml", "encoder-decoder", data,
                 train={"max_steps": STEPS, "eval_every": 3, "save_every": 3,
                        "metric_examples": 8})
    vaswani("train", str(cfg), "--out", str(tmp / "straight"))
    return tmp, cfg


def assert_same_run(a: Path, b: Path, steps: int = STEPS, atol: float = 1e-5,
                    loss_atol: float = 1e-5) -> None:
    """Equal losses at every step and equal final weights, to fp32 roundoff (``loss_atol``
    and ``atol``)."""
    la, lb = losses(a), losses(b)
    assert sorted(la) == sorted(lb) == list(range(1, steps + 1))
    for step in la:
        assert abs(la[step] - lb[step]) <= loss_atol, (step, la[step], lb[step])
    wa, wb = (load_file(str(run / "last/model.safetensors")) for run in (a, b))
    assert wa.keys() == wb.keys()
    d = 32
    for name in wa:
        x, y = wa[name], wb[name]
        if name.endswith("in_proj.bias"):  # the key bias: see test_key_bias_gradient_is_zero
            x, y = torch.cat([x[:d], x[2 * d:]]), torch.cat([y[:d], y[2 * d:]])
        assert_close(x, y, rtol=0, atol=atol, msg=name)


def test_fsdp_on_two_processes_equals_one_process(runs):
    tmp, cfg = runs
    out = tmp / "fsdp2"
    vaswani("train", str(cfg), "--out", str(out), "--set", "train.parallel=fsdp", nproc=2)
    assert_same_run(tmp / "straight", out)
    shards = sorted(p.name for p in (out / "last/sharded").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    # the run is used as any run is, by one process, from its single-file weights
    from vaswani.inference import load

    assert isinstance(load(out).translate(["abc"])[0], str)
    assert (out / "model.safetensors").exists()  # the best weights, gathered


def test_init_from_is_loaded_into_the_slices(small_runs, tmp_path):
    """A classifier started from another run's encoder by two FSDP processes, each loading
    its slices of the body (one tensor at a time) and initialising the new head's slices,
    trains as one unsharded process does."""
    base_dir, _ = small_runs["encoder"]
    data = classification_file(tmp_path / "d.tsv", n=60)
    cfg = config(tmp_path / "ft.toml", "encoder", data,
                 train={"init_from": str(base_dir), "max_steps": 3, "eval_every": 3,
                        "save_every": 3})
    vaswani("train", str(cfg), "--out", str(tmp_path / "one"))
    vaswani("train", str(cfg), "--out", str(tmp_path / "two"), "--set", "train.parallel=fsdp",
            nproc=2)
    assert_same_run(tmp_path / "one", tmp_path / "two", steps=3)


def test_a_lora_classifier_trains_sharded_as_one_process(small_runs, tmp_path):
    """LoRA on a classifier under FSDP: the new head drawn after the body, the adapters last,
    as one unsharded process draws them; its checkpoints the head and the adapters alone."""
    from vaswani.config import dump_toml

    base_dir, _ = small_runs["encoder"]
    data = classification_file(tmp_path / "d.tsv", n=60)
    cfg = config(tmp_path / "ft.toml", "encoder", data,
                 train={"init_from": str(base_dir), "max_steps": 3, "eval_every": 3,
                        "save_every": 3})
    cfg.write_text(cfg.read_text() + "\n" + dump_toml(
        {"finetune": {"method": "lora", "rank": 2, "alpha": 4.0, "targets": ["q", "v", "o"]}}))
    vaswani("train", str(cfg), "--out", str(tmp_path / "one"))
    vaswani("train", str(cfg), "--out", str(tmp_path / "two"), "--set", "train.parallel=fsdp",
            nproc=2)
    assert_same_run(tmp_path / "one", tmp_path / "two", steps=3)
    saved = load_file(str(tmp_path / "two/last/model.safetensors"))
    assert all(".lora_" in n or n.startswith("head.") for n in saved)
    assert any(n.startswith("head.") for n in saved)


@pytest.mark.slow
def test_a_sharded_run_resumes_on_another_number_of_processes(runs):
    """2 -> 1 and 1 -> 2 processes, with activation checkpointing: each equals the straight
    run (no dropout here: with dropout, masks depend on the number of processes)."""
    tmp, cfg = runs
    sharded = ["--set", "train.parallel=fsdp", "--set", "train.checkpoint_activations=true"]
    for first, then in [(2, 1), (1, 2)]:
        out = tmp / f"resume-{first}-{then}"
        vaswani("train", str(cfg), "--out", str(out), "--set", "train.max_steps=3", *sharded,
                nproc=first)
        vaswani("train", "--resume", str(out), "--set", f"train.max_steps={STEPS}",
                nproc=then)
        assert_same_run(tmp / "straight", out)


def test_a_sharded_save_killed_part_way_leaves_the_last_checkpoint(runs):
    tmp, cfg = runs
    out = tmp / "killed"
    helper = str(Path(__file__).with_name("kill_in_save.py"))
    done = vaswani("train", str(cfg), "--out", str(out), "--set", "train.parallel=fsdp",
                   nproc=2, script=helper, env={"KILL_AT": "2", "KILL_RANK": "1"},
                   check=False)
    assert done.returncode != 0
    assert json.loads((out / "last/state.json").read_text())["step"] == 3  # the step-3 save
    assert (out / "sharded.tmp").is_dir()  # step 6's shards, never moved into last/
    vaswani("train", "--resume", str(out), nproc=2)
    assert not (out / "sharded.tmp").exists()
    assert_same_run(tmp / "straight", out)


def test_rank_1_failing_to_load_the_data_ends_every_rank_with_its_message(runs):
    """Rank 1 fails while rank 0 goes on to train: rank 0 must not wait at its first
    collective for a rank that has left (a hang would fail the test by its 300 s timeout)."""
    tmp, cfg = runs
    out = tmp / "fail-load"
    helper = str(Path(__file__).with_name("fail_in_save.py"))
    done = vaswani("train", str(cfg), "--out", str(out), nproc=2, script=helper,
                   env={"FAIL_STEP": "0", "FAIL": "load"}, check=False)
    assert done.returncode != 0
    assert "rank 1 could not read" in done.stderr
    assert not (out / "last").exists()


def test_resuming_an_unsharded_run_sharded_is_refused(tmp_path):
    data = reverse_task(tmp_path / "pairs.tsv")
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data, train={"max_steps": 2})
    train(str(cfg), [], out=str(tmp_path / "run"), launch=Launch(progress=False))
    with pytest.raises(ValueError, match="resume it with --set train.parallel=ddp"):
        train(None, ["train.max_steps=4", "train.parallel=fsdp"], resume=str(tmp_path / "run"),
              launch=Launch(progress=False))
    assert not torch.distributed.is_initialized()  # the group of one was ended


def test_fsdp_refuses_fp16():
    from vaswani.config import TrainConfig

    with pytest.raises(ValueError, match="fsdp' trains in fp32 or bf16"):
        TrainConfig(parallel="fsdp", precision="fp16").validate()


def test_bf16_shards_compute_in_bf16_and_keep_fp32_master_weights():
    from vaswani import ModelConfig, build_model
    from vaswani.training import distributed, sharding

    group = distributed.init(0, 1, 0, torch.device("cpu"), group_of_one=True)
    try:
        torch.manual_seed(0)
        cfg = ModelConfig(arch="decoder", vocab_size=50, d_model=16, n_heads=2, d_ff=32,
                          n_layers=2, max_len=16, dropout=0.0)
        model = sharding.shard(build_model(cfg), "cpu", "bf16")
        assert model.embed.token.weight.__class__.__name__ == "DTensor"
        x = torch.randint(0, 50, (2, 5))
        logits = model(x, mask=torch.ones_like(x, dtype=torch.bool))
        assert logits.dtype == torch.bfloat16  # gathered in bf16, computed in bf16
        logits.float().sum().backward()
        for name, p in model.named_parameters():  # the sharded master weights and gradients
            assert p.dtype == p.grad.dtype == torch.float32, name
        assert model.output_proj.weight is model.embed.token.weight  # still tied
    finally:
        distributed.shutdown(group)


def test_a_cpu_run_shards_on_a_cpu_mesh_where_there_is_a_gpu(monkeypatch):
    """FSDP's own default mesh is the accelerator's: on a one-GPU machine two CPU processes
    would each ask for a GPU of their own ("invalid device ordinal", found on an H200). The
    accelerator is faked here; the mesh must follow the run's device."""
    from vaswani import ModelConfig, build_model
    from vaswani.training import distributed, sharding

    monkeypatch.setattr(torch._C, "_get_accelerator", lambda: torch.device("cuda"))
    group = distributed.init(0, 1, 0, torch.device("cpu"), group_of_one=True)
    try:
        cfg = ModelConfig(arch="decoder", vocab_size=50, d_model=16, n_heads=2, d_ff=32,
                          n_layers=1, max_len=16, dropout=0.0)
        model = sharding.shard(build_model(cfg), "cpu")
        assert model.embed.token.weight.device_mesh.device_type == "cpu"
    finally:
        distributed.shutdown(group)


@pytest.mark.parametrize("fail", ["best", "disk"])
def test_when_rank_0_fails_alone_every_rank_stops_at_once(runs, fail):
    """Rank 0 fails the work it does alone: keeping the best weights of the first evaluation
    (step 3: non-finite weights) or writing last/ at step 6 (a full disk). Rank 1 stops too
    with a message, instead of waiting at the next collective until the process group times
    out (the subprocess timeout would fail the test first); what was saved stays."""
    tmp, cfg = runs
    out = tmp / f"fail-{fail}"
    helper = str(Path(__file__).with_name("fail_in_save.py"))
    step = 3 if fail == "best" else 6
    done = vaswani("train", str(cfg), "--out", str(out), "--set", "train.parallel=ddp",
                   nproc=2, script=helper, env={"FAIL_STEP": str(step), "FAIL": fail},
                   check=False)
    assert done.returncode != 0
    if fail == "best":
        assert not (out / "last").exists()
        assert "rank 0 found the weights no longer finite while evaluating step 3" in done.stderr
    else:
        assert json.loads((out / "last/state.json").read_text())["step"] == 3
        assert "rank 0 failed while saving step 6" in done.stderr
    assert "No space left" in done.stderr or "no longer finite at step 3 (test)" in done.stderr


@pytest.mark.slow
def test_muon_on_ddp_and_fsdp_equals_one_process(runs):
    """Muon with DDP (every rank orthogonalizes the same averaged gradient) and with FSDP
    (torch.optim.Muon on DTensor slices: the Newton-Schulz products gather what they need),
    the sharded run saved and resumed part-way through (both optimizers' states in DCP's
    checkpoint), each equal to one process.

    Equal to bf16's roundoff, not fp32's: Muon's iterations run in bf16, where a gradient
    summed over ranks in another order can round one element to the next bf16 value, and
    that moves most of the orthogonalized update by up to ~3% of its largest element (a
    one-ulp change in a 32 x 32 matrix: 82% of the output changes, by up to 0.011 of 0.46).
    Measured here: losses within 3e-4 of one process's (a missed or doubled update moves
    the loss by 1e-2 or more), weights within 0.009."""
    tmp, cfg = runs
    muon = ["--set", "train.optimizer=muon"]
    vaswani("train", str(cfg), "--out", str(tmp / "muon-1"), *muon)
    vaswani("train", str(cfg), "--out", str(tmp / "muon-ddp"), *muon, nproc=2)
    fsdp = tmp / "muon-fsdp"
    vaswani("train", str(cfg), "--out", str(fsdp), *muon, "--set", "train.parallel=fsdp",
            "--set", "train.max_steps=3", nproc=2)
    vaswani("train", "--resume", str(fsdp), "--set", f"train.max_steps={STEPS}", nproc=2)
    for other in (tmp / "muon-ddp", fsdp):
        assert_same_run(tmp / "muon-1", other, atol=2e-2, loss_atol=1e-3)
    straight = load_file(str(tmp / "straight/last/model.safetensors"))
    muon_weights = load_file(str(tmp / "muon-1/last/model.safetensors"))
    assert not torch.allclose(straight["decoder.layers.0.feed_forward.linear1.weight"],
                              muon_weights["decoder.layers.0.feed_forward.linear1.weight"])


@pytest.mark.slow
def test_a_mixture_of_experts_trains_alike_sharded(tmp_path):
    """FSDP over two processes trains a language model of sixteen experts, one a token (on
    each rank, each step, some expert no token chose: its gradient is zero, not missing, so
    the ranks' reductions match), as one process does."""
    from tests.training.fixtures import text_file

    cfg = config(tmp_path / "c.toml", "decoder", text_file(tmp_path / "text.txt", n=600),
                 model={"experts": {"count": 16, "per_token": 1, "d_ff": 8, "aux_loss": 0.0},
                        "activation": "swiglu", "norm_first": True, "bias": False},
                 data={"batch_size": 2, "block_size": 8},
                 train={"max_steps": 4, "eval_every": 4, "save_every": 4})
    vaswani("train", str(cfg), "--out", str(tmp_path / "one"))
    vaswani("train", str(cfg), "--out", str(tmp_path / "two"), "--set", "train.parallel=fsdp",
            nproc=2)
    assert_same_run(tmp_path / "one", tmp_path / "two", steps=4)
