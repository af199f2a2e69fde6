"""ONNX: each family's forward pass as ONNX graphs with dynamic batch and length, exported with
``torch.onnx`` and checked with ONNX Runtime against vaswani on the export's own sample before
the folder is written.

    encoder (classifier)   model.onnx    input_ids, attention_mask -> logits (B, C)
                                         (hidden states (B, S, D) for a run without a head)
    decoder (LM)           model.onnx    input_ids, attention_mask -> logits (B, T, V)
    encoder-decoder        encoder.onnx  input_ids, attention_mask -> memory (B, S, D)
                           decoder.onnx  decoder_input_ids, memory, attention_mask
                                         -> logits (B, T, V), teacher-forced

The translator's decoder is the whole teacher-forced pass (no KV cache): exact, and enough for
scoring and for greedy or beam search that re-runs the prefix (benchmarks/export.py has a greedy
translator written with ONNX Runtime alone). Masks are
booleans, True = real token, as everywhere in vaswani. The folder also holds
``onnx_export.json``: the inputs and outputs, and the largest difference measured against
vaswani at export time.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from ..config.family import family
from . import refuse

TOLERANCE = 1e-4  # the largest |ONNX Runtime - vaswani| accepted at export time (fp32)


class _Graph(nn.Module):
    """One exported graph: ``fn(model, *inputs)`` as a module (what the exporter traces).

    Made in eval mode: the exporter puts a module back in the mode it found it in, and a new
    module is in training mode; the comparison after the export would then run vaswani with
    dropout on (a model trained or imported with dropout > 0 then "differed" from ONNX)."""

    def __init__(self, model, fn):
        super().__init__()
        self.model, self.fn = model, fn
        self.eval()

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.fn(self.model, *inputs)


def _classify(model, ids: Tensor, keep: Tensor) -> Tensor:
    """Class logits; a run without a head gives its hidden states."""
    return model.encode(ids, mask=keep) if model.head is None else model(ids, mask=keep)


def _lm(model, ids: Tensor, keep: Tensor) -> Tensor:
    return model(ids, mask=keep)


def _encode(model, ids: Tensor, keep: Tensor) -> Tensor:
    return model.encode(ids, src_mask=keep)


def _decode(model, tgt: Tensor, memory: Tensor, keep: Tensor) -> Tensor:
    return model.decode(tgt, memory, src_mask=keep)


def check(config) -> None:
    """Rotary positions do not trace exactly (measured: ONNX Runtime differed from vaswani by
    more than 1 on the check batch, for a translator and a language model alike), so they are
    refused by name rather than left to fail the export-time comparison."""
    if config.positional == "rope":
        raise refuse("onnx", "positional", config.positional, "sinusoidal, learned or none; "
                     "rotary positions do not trace exactly")


def _sample(run, length: int = 7, batch: int = 2) -> tuple[Tensor, Tensor]:
    """A padded sample batch: the second row shorter than the first."""
    pad = run.config.model.pad_id
    low = 4 if run.config.model.vocab_size > 8 else 0
    ids = torch.randint(low, run.config.model.vocab_size, (batch, length),
                        generator=torch.Generator().manual_seed(0), device="cpu")
    ids[1:, length - 2:] = pad
    return ids, ids != pad


def _export(module: nn.Module, args: tuple, path: Path, names: list[str], outputs: list[str],
            axes: dict) -> None:
    import warnings

    with warnings.catch_warnings():  # the tracer's notes on Python-side checks it records
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=names, output_names=outputs,
                          dynamic_axes=axes, opset_version=17, dynamo=False)


def _run(path: Path, feeds: dict[str, Tensor]) -> list:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {k: v.numpy() for k, v in feeds.items()})


def write(run, out: Path) -> None:
    """Export ``run``'s forward pass(es) to ``out`` and check them with ONNX Runtime."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        raise ImportError("the onnx format needs onnx and onnxruntime: pip install "
                          "'vaswani[export]'") from None
    c = run.config.model
    check(c)
    model = run.model.float().eval().cpu()
    out.mkdir(parents=True)
    ids, keep = _sample(run)
    seq = {0: "batch", 1: "length"}
    worst = 0.0
    with torch.no_grad():
        if family(c.arch).cross:
            bos = (run.target_tokenizer or run.source_tokenizer).bos_id
            tgt = torch.cat([torch.full((ids.size(0), 1), bos), ids[:, :4]], 1)
            tgt[1:, 3:] = c.pad_id
            _export(_Graph(model, _encode), (ids, keep), out / "encoder.onnx",
                    ["input_ids", "attention_mask"], ["memory"],
                    {"input_ids": seq, "attention_mask": seq, "memory": seq})
            memory = model.encode(ids, src_mask=keep)
            _export(_Graph(model, _decode), (tgt, memory, keep), out / "decoder.onnx",
                    ["decoder_input_ids", "memory", "attention_mask"], ["logits"],
                    {"decoder_input_ids": {0: "batch", 1: "target_length"},
                     "memory": seq, "attention_mask": seq,
                     "logits": {0: "batch", 1: "target_length"}})
            got = _run(out / "encoder.onnx", {"input_ids": ids, "attention_mask": keep})[0]
            worst = max(worst, float((torch.from_numpy(got) - memory)[keep].abs().max()))
            logits = model.decode(tgt, memory, src_mask=keep)
            got = _run(out / "decoder.onnx", {"decoder_input_ids": tgt, "memory": memory,
                                              "attention_mask": keep})[0]
            real = tgt != c.pad_id
            worst = max(worst, float((torch.from_numpy(got) - logits)[real].abs().max()))
            files = {"encoder.onnx": "input_ids, attention_mask -> memory",
                     "decoder.onnx": "decoder_input_ids, memory, attention_mask -> logits"}
        else:
            encoder_only = not family(c.arch).decoder  # a classifier or an embedder
            wrapper = _Graph(model, _classify if encoder_only else _lm)
            output = "logits" if not encoder_only or model.head is not None else "hidden"
            axes = {"input_ids": seq, "attention_mask": seq}
            axes[output] = {0: "batch"} if output == "logits" and encoder_only else seq
            _export(wrapper, (ids, keep), out / "model.onnx", ["input_ids", "attention_mask"],
                    [output], axes)
            expected = wrapper(ids, keep)
            got = torch.from_numpy(_run(out / "model.onnx",
                                        {"input_ids": ids, "attention_mask": keep})[0])
            diff = (got - expected).abs()
            worst = float(diff.max() if diff.dim() == 2 and encoder_only
                          else diff[keep].max())
            files = {"model.onnx": f"input_ids, attention_mask -> {output}"}
    if not worst <= TOLERANCE:
        raise RuntimeError(f"onnx export: ONNX Runtime differs from vaswani by {worst:.2e} "
                           f"(> {TOLERANCE:g}) on the check batch; the export is not exact")
    (out / "onnx_export.json").write_text(json.dumps(
        {"arch": c.arch, "files": files, "masks": "bool, True = real token",
         "max_abs_difference": worst, "opset": 17}, indent=2) + "\n")
