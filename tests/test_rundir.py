"""Run directories: crash-safe writes, checkpoints, weights (tied, compiled, older names)."""

import os

import pytest
import torch
from safetensors.torch import load_file
from torch.testing import assert_close

from vaswani import rundir


def test_a_kill_between_renames_leaves_a_loadable_checkpoint(tmp_path):
    model = torch.nn.Linear(3, 2)
    rundir.save_last(tmp_path, model, {"x": torch.ones(1)}, {"step": 1})
    # Simulate a kill after `last` was moved aside and before `last.tmp` took its place.
    os.replace(tmp_path / "last", tmp_path / "last.old")
    assert rundir.find_last(tmp_path) == tmp_path / "last.old"
    rundir.save_last(tmp_path, model, {"x": torch.ones(1)}, {"step": 2})
    (tmp_path / "last.tmp").mkdir()  # an incomplete write is never chosen
    assert rundir.find_last(tmp_path) == tmp_path / "last"
    _, state = rundir.load_last(tmp_path, model)
    assert state["step"] == 2


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "f.json"
    rundir.atomic_write_text(path, "old")

    def explode(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        rundir.atomic_write(path, explode)
    assert path.read_text() == "old"


def test_tied_and_compiled_names_load_back(tmp_path):
    from vaswani import ModelConfig, build_model

    model = build_model(ModelConfig(arch="decoder", vocab_size=11, d_model=8, n_heads=2,
                                    d_ff=16, n_layers=1))
    rundir.save_weights(model, tmp_path / "m.safetensors")
    stored = load_file(str(tmp_path / "m.safetensors"))
    assert "output_proj.weight" not in stored  # tied to embed.token.weight, stored once
    other = build_model(model.config)
    rundir.load_weights(other, tmp_path / "m.safetensors")
    assert other.output_proj.weight is other.embed.token.weight
    assert_close(other.output_proj.weight, model.output_proj.weight)
    from safetensors.torch import save_file
    save_file({f"_orig_mod.{k}": v for k, v in stored.items()}, str(tmp_path / "c.safetensors"))
    rundir.load_weights(build_model(model.config), tmp_path / "c.safetensors")
