"""Export a trained run to other engines: ``vaswani export RUN_DIR --format ct2 --out DIR``.

One module per format, each reading the run through :mod:`vaswani.rundir` and writing the
weights in the target's own layout:

    ct2.py   CTranslate2 (translators and language models; ``quantize="int8"`` as CTranslate2
             quantizes), written through its spec API as its own converters do
    hf.py    Hugging Face transformers (encoders as BERT, language models as LLaMA or GPT-2),
             loadable with ``AutoModel*.from_pretrained`` and ``AutoTokenizer``
    onnx.py  ONNX (every family's forward pass, dynamic batch and length), checked with
             ONNX Runtime

A run option with no exact counterpart in the target format is an :class:`ExportError` that
names the option and its value, never a silent approximation. Every export folder keeps a copy
of the run's ``config.toml`` and ``tokenizer/`` under ``vaswani/``, so the exported model can be
used from vaswani (``vaswani translate DIR --engine ct2``) without the run directory.
"""

from __future__ import annotations

import shutil
from pathlib import Path

FORMATS = ("hf", "onnx", "ct2")
SOURCE = "vaswani"  # the folder, inside an export, that holds the run's config and tokenizer


class ExportError(ValueError):
    """The run cannot be exported to this format exactly (the message names the option)."""


def refuse(fmt: str, option: str, value, supported: str) -> ExportError:
    return ExportError(f"cannot export to {fmt}: [model] {option} = {value!r} has no "
                       f"counterpart there ({supported})")


def how_to_use(fmt: str, out: Path) -> str:
    """One line saying how to use an export in ``out``."""
    return {"ct2": f"vaswani translate {out} --engine ct2   (or generate ... --engine ct2)",
            "hf": f"transformers' AutoModel*.from_pretrained({str(out)!r}) and "
                  f"AutoTokenizer.from_pretrained({str(out)!r})",
            "onnx": f"onnxruntime.InferenceSession(...) on {out}/*.onnx (inputs and outputs in "
                    f"{out}/onnx_export.json)"}[fmt]


def export(run_dir: str | Path, fmt: str, out: str | Path, *, quantize: str | None = None,
           overwrite: bool = False) -> Path:
    """Export the run at ``run_dir`` to ``out`` in format ``fmt``; returns ``out``.

    Everything is checked and built in a temporary folder next to ``out`` before ``out`` is
    touched: a refused or failed export leaves ``out`` as it was."""
    from .. import rundir
    from ..inference import load

    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if quantize not in (None, "int8"):
        raise ExportError(f"unknown quantization {quantize!r}; the choice is int8")
    if quantize and fmt != "ct2":
        raise ExportError(f"--quantize {quantize} is for --format ct2 (CTranslate2 quantizes "
                          f"its own weights); {fmt} exports float32")
    run_dir, out = Path(run_dir), Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty; pass --overwrite to replace it")
    run = load(run_dir)
    from . import ct2, hf, onnx

    writer = {"ct2": lambda dest: ct2.write(run, dest, quantize=quantize),
              "hf": lambda dest: hf.write(run, dest),
              "onnx": lambda dest: onnx.write(run, dest)}[fmt]

    tmp = out.with_name(out.name + ".tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        writer(tmp)
        shutil.copytree(run_dir / rundir.TOKENIZER, tmp / SOURCE / rundir.TOKENIZER)
        shutil.copy2(run_dir / rundir.CONFIG, tmp / SOURCE / rundir.CONFIG)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
