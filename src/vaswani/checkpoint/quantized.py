"""Loading a run with its weights quantized as they are read (``vaswani.load(...,
quantize=...)``, ``--quantize``): each linear layer's float weight is in memory only until its
int8 or int4 copy is made, and a language model's token table becomes int8 rows the same way,
so the float model is never whole in memory, and the table is read in blocks of rows, so it
is never whole in float either (cpu/quantized.py has the layers). The float weights' memory
is handed back to the kernel as the reading goes (``GIVE_BACK_EVERY``), so it is not left
resident among the quantized layers."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..config.family import family
from ..cpu.quantized import Int8Embedding, WeightOnlyLinear, int8_fits, narrow_head, quantized
from ..devices import give_back_freed_memory
from ..models import build_model
from ..models.common import fill_buffers
from ..nn.positional import Embeddings
from . import unwrap
from .files import iter_weights

TABLE_ROWS = 4096  # a token table is read and quantized this many rows at a time
GIVE_BACK_EVERY = 64 << 20  # bytes of float weights read between two give-backs


def load_quantized(model: nn.Module, path: Path, kind: str, *, weight_only: bool) -> None:
    """:func:`~vaswani.checkpoint.load_weights` into a meta-device ``model`` (``build_model(...,
    device="meta")``) whose linear layers are quantized as their weights are read, and, with
    ``weight_only`` (a language model), whose token table is kept in int8 rows
    (:class:`~vaswani.cpu.quantized.Int8Embedding`), which a tied output head shares. The
    other tensors become the model's parameters as they are read (no second copy); tied
    names share one. The file's sha256 is checked as ``load_weights`` checks it."""
    model = unwrap(model)
    linears = {name: module for name, module in model.named_modules()
               if isinstance(module, nn.Linear)}
    tables = {f"{name}.token" for name, module in model.named_modules()  # int8 rows where a
              if isinstance(module, Embeddings)  # tied head could share them (int8_fits)
              and int8_fits(module.token.embedding_dim)} if weight_only else set()
    shared: dict[int, list[str]] = {}  # a tensor's names (a tied output head has two)
    for name, p in model.named_parameters(remove_duplicate=False):
        shared.setdefault(id(p), []).append(name)
    names_of = {name: names for names in shared.values() for name in names}
    biases: dict[str, torch.Tensor] = {}
    done: set[str] = set()
    tables_stored = {f"{name}.weight" for name in tables}  # (V, D): read in row blocks
    read = 0  # bytes of weights read since the freed ones were last given back
    for stored, value in iter_weights(
            path, lambda n: TABLE_ROWS if n.replace("_orig_mod.", "") in tables_stored else 0):
        stored = stored.replace("_orig_mod.", "")
        read += value.shape.numel() * value.dtype.itemsize  # (a tensor, or RowBlocks)
        if read >= GIVE_BACK_EVERY:
            give_back_freed_memory()
            read = 0
        if stored not in names_of:
            raise ValueError(f"{path} does not match the model: unexpected {stored!r}")
        kept = None  # the one Parameter every other name of this tensor shares
        table = None  # a token table's int8 rows, which a tied head shares
        for name in sorted(names_of[stored], key=lambda n: n.rpartition(".")[0] not in tables):
            owner, _, attr = name.rpartition(".")
            target = model.get_submodule(owner)  # a layer is replaced after its weight
            expected = getattr(target, attr).shape
            if value.shape != expected:
                raise ValueError(f"{path} does not match the model built from the config: "
                                 f"{name} {tuple(value.shape)} (the model's: "
                                 f"{tuple(expected)}) (was config.toml edited?)")
            parent, _, child = owner.rpartition(".")
            if owner in linears and attr == "bias":  # read before its weight (name order)
                biases[owner] = value
            elif owner in linears and table is not None:
                setattr(model.get_submodule(parent), child, WeightOnlyLinear.sharing(table))
            elif owner in linears:
                layer = linears[owner]
                real = nn.Linear(layer.in_features, layer.out_features,
                                 bias=layer.bias is not None, device="meta")
                real.weight = nn.Parameter(value, requires_grad=False)
                if layer.bias is not None:
                    real.bias = nn.Parameter(biases.pop(owner), requires_grad=False)
                setattr(model.get_submodule(parent), child,
                        quantized(real, kind, weight_only=weight_only))
            elif owner in tables:
                table = Int8Embedding(value, value.shape)
                setattr(model.get_submodule(parent), child, table)
            else:
                kept = nn.Parameter(value, requires_grad=False) if kept is None else kept
                setattr(target, attr, kept)
            done.add(name)
    missing = [n for n in names_of if n not in done]
    if missing:
        raise ValueError(f"{path} does not match the model: missing {missing[:5]}")
    narrow_head(model)
    give_back_freed_memory()
    for module in model.modules():  # the buffers no file holds: computed next (fill_buffers)
        for name, b in list(module.named_buffers(recurse=False)):
            if b.is_meta:
                setattr(module, name, torch.empty(b.shape, dtype=b.dtype, device="cpu"))


def load_frozen(config, path: Path, kind: str, device: torch.device) -> nn.Module:
    """QLoRA's base: the language model of ``config`` (a ``ModelConfig``) with the weights of
    ``path`` read straight into int8 or int4 layers (:func:`load_quantized`: never whole in
    float), every tensor frozen; the adapters are added next (models/finetune.py). On a CPU
    (PyTorch's int8 and int4 kernels are CPU ones)."""
    if device.type != "cpu" or not family(config.arch).language_model:
        raise ValueError(f'[finetune] quantize = "{kind}" (QLoRA) trains a language model on a '
                         "CPU (PyTorch's int8/int4 kernels are CPU ones); this run is "
                         f"{family(config.arch).describes} on {device}")
    model = build_model(config, device="meta")
    load_quantized(model, path, kind, weight_only=True)
    fill_buffers(model)  # the tables no file holds (rotary or sinusoidal positions)
    return model.requires_grad_(False)
