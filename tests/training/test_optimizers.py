"""The optimizers: Muon's step against PyTorch's own, its Newton-Schulz iteration in float32
where bf16 is slow."""

import pytest
import torch

from vaswani.training import optimizers
from vaswani.training.optimizers import Muon, orthogonalize, orthogonalize_all


def matrices(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g))
            for shape in [(24, 8), (8, 24), (16, 16)]]  # tall, wide, square


def run(make, steps: int = 4) -> list[torch.Tensor]:
    """``steps`` updates of fresh matrices with the same gradients; the weights and the
    momentum buffers after them."""
    params = matrices()
    opt = make(params)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return [p.detach().clone() for p in params] + [opt.state[p]["momentum_buffer"]
                                                   for p in params]


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_in_bf16_is_pytorchs_muon_to_the_bit(nesterov):
    options = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.9, "nesterov": nesterov}
    ours = run(lambda ps: Muon(ps, ortho_dtype=torch.bfloat16, **options))
    theirs = run(lambda ps: torch.optim.Muon(ps, **options))
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def test_muon_in_float32_follows_the_same_steps_more_exactly():
    """float32 iteration: close to the bf16 step (same algorithm), closer to one done in
    float64 than the bf16 step is."""
    options = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.9}
    fp32 = run(lambda ps: Muon(ps, ortho_dtype=torch.float32, **options))
    bf16 = run(lambda ps: Muon(ps, ortho_dtype=torch.bfloat16, **options))
    fp64 = run(lambda ps: Muon(ps, ortho_dtype=torch.float64, **options))
    for a, b, exact in zip(fp32[:3], bf16[:3], fp64[:3], strict=True):
        torch.testing.assert_close(a, b, atol=0.02, rtol=0)
        assert (a - exact).abs().max() < 1e-4 < (b - exact).abs().max()


def test_orthogonalize_brings_every_singular_value_near_one():
    coefficients = (3.4445, -4.7750, 2.0315)  # Muon's quintic
    for shape in [(64, 16), (16, 64), (32, 32)]:
        update = torch.randn(shape, generator=torch.Generator().manual_seed(2))
        out = orthogonalize(update, coefficients, 5, 1e-7, torch.float32)
        assert out.shape == shape and out.dtype == torch.float32
        s = torch.linalg.svdvals(out)
        assert s.min() > 0.5 and s.max() < 1.3, s
        assert torch.equal(update, torch.randn(shape, generator=torch.Generator().manual_seed(2)))


def test_matrices_of_one_shape_are_orthogonalized_stacked_as_one_by_one():
    """orthogonalize_all stacks the updates of one shape: the same result as one at a time
    (float32: to its roundoff; bf16: to a bf16 step, the same bits on some CPUs), in the
    order given; a lone shape, and a tensor of a subclass (a DTensor shard; here a
    Parameter), go alone."""
    coefficients = (3.4445, -4.7750, 2.0315)
    g = torch.Generator().manual_seed(3)
    shapes = [(24, 8), (16, 16), (24, 8), (8, 24), (24, 8), (16, 16)]
    updates = [torch.randn(shape, generator=g) for shape in shapes]
    updates[4] = torch.nn.Parameter(updates[4])
    for dtype, atol in [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)]:
        together = orthogonalize_all(updates, coefficients, 5, 1e-7, dtype)
        alone = [orthogonalize(u, coefficients, 5, 1e-7, dtype) for u in updates]
        assert [x.shape for x in together] == [torch.Size(s) for s in shapes]
        for a, b in zip(together, alone, strict=True):
            assert a.dtype == dtype
            torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=0)
    # a stack must not mix the matrices up: each result belongs to its own update
    together = orthogonalize_all(updates, coefficients, 5, 1e-7, torch.float32)
    assert not torch.allclose(together[0], together[2], atol=0.1)


def test_muon_with_repeated_shapes_follows_pytorchs_muon():
    """A model's layers repeat shapes, so its Muon step stacks them: within bf16 rounding of
    PyTorch's own step, one matrix at a time."""
    def params():
        g = torch.Generator().manual_seed(0)
        return [torch.nn.Parameter(torch.randn(shape, generator=g))
                for shape in [(24, 8), (24, 8), (16, 16), (16, 16), (16, 16)]]

    def steps(opt, ps):
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            for p in ps:
                p.grad = torch.randn(p.shape, generator=g)
            opt.step()
        return ps

    options = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.9}
    ours = steps(Muon(a := params(), ortho_dtype=torch.bfloat16, **options), a)
    theirs = steps(torch.optim.Muon(b := params(), **options), b)
    for x, y, start in zip(ours, theirs, params(), strict=True):
        torch.testing.assert_close(x, y, atol=3e-3, rtol=0)
        assert (x - start).abs().max() > 0.01  # it moved: three steps of 0.02


@pytest.mark.parametrize("fast", [True, False])
def test_muon_iterates_in_bf16_only_where_bf16_is_fast(monkeypatch, fast):
    from vaswani import ModelConfig, build_model
    from vaswani.config import TrainConfig

    monkeypatch.setattr(optimizers, "bf16_is_fast", lambda device: fast)
    model = build_model(ModelConfig(arch="decoder", vocab_size=11, d_model=8, n_heads=2,
                                    d_ff=16, n_layers=1))
    opt = optimizers.make_optimizer(model, TrainConfig(optimizer="muon"))
    assert opt.parts["muon"][0].ortho_dtype == (torch.bfloat16 if fast else torch.float32)


def test_muon_decides_a_skip_on_the_device_and_skips_exactly():
    """Muon.step(finite=flag): with the flag true, the same update to the bit as without one;
    false (a NaN gradient), weights and momentum buffers as they were. No host read."""
    options = {"lr": 0.02, "weight_decay": 0.1, "momentum": 0.9}
    flagged = run(lambda ps: FlaggedMuon(ps, torch.tensor(True), **options))
    plain = run(lambda ps: Muon(ps, **options))
    for a, b in zip(flagged, plain, strict=True):
        assert torch.equal(a, b)
    params = matrices()
    opt = Muon(params, **options)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    before = [p.detach().clone() for p in params] + [opt.state[p]["momentum_buffer"].clone()
                                                     for p in params]
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    with HostReads() as reads:
        opt.step(finite=torch.tensor(False))
    after = [p.detach() for p in params] + [opt.state[p]["momentum_buffer"] for p in params]
    for a, b in zip(after, before, strict=True):
        assert torch.equal(a, b)
    assert reads.count == 0


class FlaggedMuon(Muon):
    def __init__(self, params, flag, **options):
        super().__init__(params, **options)
        self.flag = flag

    def step(self, closure=None):
        return super().step(closure, finite=self.flag)


class HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the reads of a tensor's value on the host (``.item()``, ``bool(t)``,
    ``.tolist()``: ``aten._local_scalar_dense``), each a wait for the device on a GPU."""

    count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_twelve_training_steps_read_nothing_on_the_host(tmp_path, optimizer):
    """A training step never waits for the device: the skip decision stays on it for every
    optimizer (fused AdamW's found_inf, Muon's flag), and the skip counters are read only on
    the steps that log or save (none of these twelve)."""
    from tests.training.fixtures import config, reverse_task
    from vaswani.config import load_run_config
    from vaswani.tasks import task_for
    from vaswani.training.loop import Trainer
    from vaswani.training.train import resolve_model

    cfg = load_run_config(config(tmp_path / "c.toml", "encoder-decoder",
                                 reverse_task(tmp_path / "p.tsv"), device="cpu",
                                 train={"optimizer": optimizer, "log_every": 1000}))
    task = task_for(cfg)
    data = task.load(tmp_path / "cache")
    cfg = resolve_model(cfg, task, data)
    (tmp_path / "run").mkdir()
    trainer = Trainer(cfg, task_for(cfg), data, tmp_path / "run", device=torch.device("cpu"),
                      progress=False)
    trainer.train_step()  # the first step sets things up (optimizer state, plans)
    with HostReads() as reads:
        for _ in range(12):
            trainer.train_step()
    assert reads.count == 0, f"{reads.count} host reads in 12 steps"
