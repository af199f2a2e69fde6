"""Run directories: crash-safe writes, checkpoints, weights (tied, compiled, older names)."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from torch.testing import assert_close

from vaswani import atomic, checkpoint, rundir


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
    atomic.atomic_write_text(path, "old")

    def explode(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic.atomic_write(path, explode)
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


# --- checkpoint averaging --------------------------------------------------------------------

def _checkpoint(run_dir, step, tensors):
    folder = run_dir / rundir.CHECKPOINTS
    folder.mkdir(exist_ok=True)
    from safetensors.torch import save_file

    save_file(tensors, str(folder / f"step-{step:06d}.safetensors"))


def test_the_average_of_identical_checkpoints_is_the_checkpoint(tmp_path):
    torch.manual_seed(0)
    tensors = {"w": torch.randn(7, 5), "b": torch.randn(5) * 1e-3, "h": torch.randn(3).half()}
    for step in (100, 200, 300):
        _checkpoint(tmp_path, step, tensors)
    path, used = checkpoint.write_average(tmp_path)
    assert len(used) == 3
    averaged = load_file(str(path))
    for name, t in tensors.items():
        assert averaged[name].dtype == t.dtype
        assert torch.equal(averaged[name], t), name  # bit for bit


def test_averaging_is_exact_arithmetic_on_the_saved_tensors(tmp_path):
    torch.manual_seed(1)
    saved = [{"w": torch.randn(4, 6), "b": torch.randn(6)} for _ in range(4)]
    for step, tensors in zip((10, 20, 30, 40), saved, strict=True):
        _checkpoint(tmp_path, step, tensors)
    path, used = checkpoint.write_average(tmp_path, last=3)  # the newest three: 20, 30, 40
    assert [p.stem for p in used] == ["step-000020", "step-000030", "step-000040"]
    averaged = checkpoint.read_weights(path)  # its checksum holds
    for name in ("w", "b"):
        exact = sum(s[name].double() for s in saved[1:]) / 3
        assert torch.equal(averaged[name], exact.float())
    with pytest.raises(ValueError, match="holds only 4 checkpoints"):
        checkpoint.write_average(tmp_path, last=5)


def test_averaging_refuses_checkpoints_of_different_models(tmp_path):
    _checkpoint(tmp_path, 1, {"w": torch.zeros(2, 2)})
    _checkpoint(tmp_path, 2, {"w": torch.zeros(3, 2)})
    with pytest.raises(ValueError, match=r"w has shape \(3, 2\)"):
        checkpoint.write_average(tmp_path)
    with pytest.raises(FileNotFoundError, match="keep_checkpoints"):
        checkpoint.write_average(tmp_path / "elsewhere")


def test_averaging_refuses_checkpoints_of_mixed_precision(tmp_path):
    """fp32 and fp16 copies of one weight once averaged silently into fp16."""
    _checkpoint(tmp_path, 1, {"w": torch.ones(2, 2)})
    _checkpoint(tmp_path, 2, {"w": torch.ones(2, 2).half()})
    with pytest.raises(ValueError, match=r"step-000002.safetensors: w is float16, but float32 "
                                         r"in .*step-000001.safetensors: average checkpoints "
                                         r"of one precision"):
        checkpoint.write_average(tmp_path)
    assert not (tmp_path / checkpoint.AVERAGED).exists()


def test_kept_checkpoints_are_bounded(tmp_path):
    model = torch.nn.Linear(3, 2)
    for step in range(1, 8):
        checkpoint.save_checkpoint(tmp_path, model, step * 100, keep=3)
    assert [p.stem for p in checkpoint.list_checkpoints(tmp_path)] == [
        "step-000500", "step-000600", "step-000700"]


def test_a_table_read_in_row_blocks_is_the_tensor_and_keeps_the_checksum(tmp_path):
    """iter_weights(path, in_blocks): the named (V, D) tensor comes in blocks of rows, read as
    they are iterated, whose rows are the tensor's; the file's sha256 still holds, and a
    flipped byte inside the table is still found."""
    torch.manual_seed(0)
    tensors = {"a.bias": torch.randn(3), "embed.weight": torch.randn(23, 4),
               "z.weight": torch.randn(2, 2)}
    path = tmp_path / "model.safetensors"
    checkpoint.write_tensors(path, tensors)
    got = {}
    for name, value in checkpoint.iter_weights(path, lambda n: 5 if n == "embed.weight" else 0):
        if isinstance(value, checkpoint.RowBlocks):
            blocks = [block.clone() for block in value]  # each read into the same memory
            assert value.shape == (23, 4) and [len(b) for b in blocks] == [5, 5, 5, 5, 3]
            value = torch.cat(blocks)
        got[name] = value
    assert got.keys() == tensors.keys() and all(torch.equal(got[k], tensors[k]) for k in got)
    raw = bytearray(path.read_bytes())
    size = int.from_bytes(raw[:8], "little")
    start, _ = json.loads(raw[8:8 + size])["embed.weight"]["data_offsets"]
    raw[8 + size + start + 4 * 4 * 7] ^= 0x10  # a number of the table's row 7 (block 2)
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="is damaged: its tensors do not match"):
        for _, value in checkpoint.iter_weights(path, lambda n: 5):
            list(value) if isinstance(value, checkpoint.RowBlocks) else value


def test_weights_are_read_on_the_cpu_whatever_torchs_default_device(tmp_path):
    """A file is read into host memory whatever `torch.set_default_device` says (the loader
    fills the model's parameters from it afterwards). With the default device a GPU, the
    reads once made their buffers there and then called the file damaged ('can't convert
    cuda:0 device type tensor to numpy'); the meta device stands in for a GPU here."""
    tensors = {"embed.weight": torch.randn(9, 4), "norm.bias": torch.randn(4)}
    path = tmp_path / "model.safetensors"
    checkpoint.write_tensors(path, tensors)
    with torch.device("meta"):
        whole = checkpoint.read_weights(path)
        blocks = {n: torch.cat([b.clone() for b in v]) if isinstance(v, checkpoint.RowBlocks)
                  else v for n, v in checkpoint.iter_weights(path, lambda n: 4)}
    for got in (whole, blocks):
        assert {t.device.type for t in got.values()} == {"cpu"}
        assert all(torch.equal(got[k], tensors[k]) for k in tensors)


def test_reading_a_weights_file_keeps_no_more_of_it_resident_than_the_tensor_at_hand(tmp_path):
    """Each tensor is read through a map of its own (checkpoint/files.py): iterating a 96 MB
    file while dropping each tensor leaves the process far below the file's size, where one
    map held open over the whole read (the library's plain use) keeps all of it resident."""
    import subprocess
    import sys

    path = tmp_path / "model.safetensors"
    checkpoint.write_tensors(path, {f"t{i}": torch.randn(1024, 2048) for i in range(12)})
    child = r"""
import hashlib, sys
from pathlib import Path
import torch
from safetensors import safe_open
from vaswani import checkpoint
from vaswani.devices import peak_resident_bytes
def peak_mb():  # this process's own peak (ru_maxrss carries the parent's over exec)
    return peak_resident_bytes() // 2**20
path, way = Path(sys.argv[1]), sys.argv[2]
base = peak_mb()
h = hashlib.sha256()
if way == "vaswani":
    for name, t in checkpoint.iter_weights(path):
        h.update(t.numpy().tobytes()[:64])
else:
    with safe_open(str(path), "pt") as f:
        for name in sorted(f.keys()):
            t = f.get_tensor(name)
            h.update(t.reshape(-1).view(torch.uint8).numpy().sum().tobytes())
            del t
print(peak_mb() - base)
"""
    grown = {way: int(subprocess.run([sys.executable, "-c", child, str(path), way],
                                     capture_output=True, text=True, check=True).stdout)
             for way in ("vaswani", "one map")}
    assert grown["vaswani"] < 40 < 90 < grown["one map"], grown
