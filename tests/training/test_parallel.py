"""training/parallel.py: which object each ``[train] parallel`` and process count gets, and
what each does where they differ (the two-process runs of DDP and FSDP themselves are in
test_sharded.py and test_trainer.py)."""

import contextlib

import pytest
import torch

from tests.training.fixtures import config, reverse_task
from vaswani.training.distributed import Dist
from vaswani.training.parallel import DDP, FSDP, Single, for_run, parallel_class
from vaswani.training.train import Launch, train


@pytest.mark.parametrize("name, world, expected", [
    ("ddp", 1, Single), ("ddp", 2, DDP), ("fsdp", 1, FSDP), ("fsdp", 4, FSDP)])
def test_the_class_for_each_setting(name, world, expected):
    assert parallel_class(name, world) is expected
    assert type(for_run(name, Dist(0, world, 0))) is expected
    assert expected.group_of_one == (expected is FSDP)  # FSDP shards over a group of one too


class Wrapped:
    """What the sync methods may touch of the module they wrap, recorded."""

    def __init__(self):
        self.calls = []

    @contextlib.contextmanager
    def no_sync(self):
        self.calls.append("no_sync")
        yield

    def set_requires_gradient_sync(self, sync):
        self.calls.append(("gradient_sync", sync))


@pytest.mark.parametrize("cls, unsynced, synced", [
    (Single, [], []),
    (DDP, ["no_sync"], []),
    (FSDP, [("gradient_sync", False)], [("gradient_sync", True)])])
def test_sync_reduces_gradients_only_in_the_last_backward(cls, unsynced, synced):
    for sync, expected in ((False, unsynced), (True, synced)):
        wrapped = Wrapped()
        with cls(Dist(0, 2, 0)).sync(wrapped, sync):
            pass
        assert wrapped.calls == expected


def test_one_process_holds_the_whole_model_and_its_optimizer():
    single = Single(Dist())
    model = torch.nn.Linear(2, 3)
    assert single.wrap(model, torch.device("cpu")) is model
    assert single.full_weights(model) is model
    assert single.evaluation_model(model, model, None, torch.device("cpu")) is model
    norm = torch.tensor(2.0)
    assert single.full(norm) is norm


def test_the_checkpoint_holds_the_optimizer_unless_sharded(tmp_path):
    """A one-process run's trainer state has the optimizer; a sharded one's has none (its
    slices hold it), and both resume."""
    data = reverse_task(tmp_path / "pairs.tsv")
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data,
                 train={"max_steps": 2, "eval_every": 2, "save_every": 2, "metric_examples": 0})
    for parallel in ("ddp", "fsdp"):
        out = tmp_path / parallel
        train(str(cfg), [f"train.parallel={parallel}"], out=str(out), launch=Launch(progress=False))
        state = torch.load(out / "last" / "trainer.pt", weights_only=True)
        assert ("optimizer" in state) == (parallel == "ddp")
        assert (out / "last" / "sharded").is_dir() == (parallel == "fsdp")
        train(None, ["train.max_steps=3"], resume=str(out), launch=Launch(progress=False))
