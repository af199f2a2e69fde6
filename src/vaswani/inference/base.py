"""A trained run, loaded for use: :func:`load` and the :class:`Run` every family's use class
builds on.

``vaswani.load(RUN_DIR)`` reads the run directory (config, tokenizers, weights), builds the
model and returns the use class of the run's task: :class:`~vaswani.inference.Translator`
(translation), :class:`~vaswani.inference.LanguageModel` (language modelling) or
:class:`~vaswani.inference.Encoder` (classification and sentence embeddings). What every run
can do is here (decoding options, evaluation, attention); what a family does is in its class.

A run loads as its family's use class (the family's record, config/family.py and
families.py), or as a task's own: a use class that names a task (``task_name = "tagging"``)
is picked up by being defined, so a task beyond its family's (tests/tasks/toy_tagging.py)
brings its use class in the same file. Asking a run for another family's work (``generate``
on a translator) is a :class:`WrongModel` error that says which kind of run the method
needs.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import ClassVar

import torch

from .. import checkpoint, rundir
from ..checkpoint.quantized import load_quantized
from ..config import DecodeConfig, RunConfig
from ..config.family import Family, families, family
from ..cpu.quantized import INT4_GROUPS, QUANTIZE, bf16_products, quantize_linears
from ..data.files import ReadReport
from ..data.prepare import split_files
from ..data.tokenizers import Tokenizer
from ..devices import resolve_device
from ..engine import Engine, EngineConfig, Params
from ..engine.adapters import choose
from ..engine.compiled import CompiledStep, load_compiled
from ..engine.config import KV_CACHE
from ..engine.package import identity, options, package_path
from ..generation import Rules
from ..models import build_model
from ..models.common import fill_buffers
from ..tasks import Task, task_for
from .finetuned import adapted
from .workers import Workers


def check_batch_size(batch_size: int) -> None:
    """A batch of fewer than one input is refused, not run one at a time or failed in range."""
    if batch_size < 1:
        raise ValueError(f"batch_size ({batch_size}) must be >= 1")


class WrongModel(ValueError, AttributeError):
    """A run was asked for what its family does not do (``generate`` on a translator). A
    ValueError for the CLI's one-line errors, an AttributeError for ``hasattr``."""


OFFLINE_ROWS = 512  # rows an offline call decodes together at most (Run.engine_for)


class Run:
    """A trained model with its tokenizers, labels, decoding settings and device."""

    registry: ClassVar[dict[str, type[Run]]] = {}  # task name -> a use class of its own
    task_name: ClassVar[str] = ""  # set by a task's own use class: the task whose runs it uses
    takes_target: ClassVar[bool] = False  # the attention explorer can be given an output
    decodes: ClassVar[bool] = False  # it generates tokens, on the inference engine
    produces_outputs: ClassVar[bool] = True  # evaluation yields an output per example
    adapter: int = 0  # which LoRA adapter of a model serving several it uses (shared.py)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "task_name" in cls.__dict__:
            Run.registry[cls.task_name] = cls

    def __init__(self, run_dir: Path, config: RunConfig, model: torch.nn.Module,
                 source_tokenizer: Tokenizer, target_tokenizer: Tokenizer | None,
                 labels: list[str], device: torch.device) -> None:
        self.run_dir, self.config, self.model = run_dir, config, model
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        self.labels, self.device = labels, device
        self.task: Task = task_for(config)
        self.chat_template: str | None = rundir.read_chat_template(run_dir)
        self.compiled = None  # the decode step compiled ahead of time (engine/compiled.py)
        self.kv_cache: str | None = None  # its engines' key/value cache dtype by name (None:
        # the model's; engine/config.py KV_CACHE)
        self.fast_prefill = False  # its engines' prefills' int8 products in bfloat16
        self.workers: Workers | None = None  # processes its offline calls are split across
        self._engine = None

    def adapted(self):
        """A context in which the model computes with this run's adapter, where it serves
        several runs' (engine/adapters.py); the engine chooses its rows' itself."""
        return choose(self.model, self.adapter)

    @property
    def family(self) -> Family:
        return family(self.config.model.arch)

    # the family's words, which a task's own use class may replace with class attributes
    @property
    def describes(self) -> str:  # for messages: "a translation model (encoder-decoder)"
        return self.family.describes

    @property
    def action(self) -> str:  # what the page does with it: "translate", ...
        return self.family.action

    @property
    def summary(self) -> str:  # one line for the page
        return self.family.summary

    @property
    def routes(self) -> tuple[str, ...]:  # the server's routes it answers
        return self.family.routes

    @property
    def engine(self) -> Engine:
        """The inference engine over this run's model (engine/) at its full offline size,
        ``OFFLINE_ROWS`` rows: what translating and generating many texts run on."""
        return self.engine_for(OFFLINE_ROWS)

    def engine_for(self, rows: int) -> Engine:
        """The engine for an offline call that decodes ``rows`` rows together: the one made
        before if it holds that many, else a new one with room for them (a power of two, at
        most ``OFFLINE_ROWS``). An engine allocates and zeroes its key/value cache when it is
        made (at 512 rows, hundreds of MB for the translator tutorial's model), so
        translating one sentence makes a cache for the rows it uses, not for 512."""
        rows = min(OFFLINE_ROWS, 1 << (max(rows, 1) - 1).bit_length())
        if self._engine is None or self._engine.config.max_rows < rows:
            self._engine = None  # the smaller cache freed before the larger is made
            # within the cache's memory (cache_bytes; why wide steps: docs/performance.md,
            # "The engine's choices for a CPU")
            self._engine = self.new_engine(EngineConfig.offline(rows))
        return self._engine

    def input_tokens(self, texts: list[str]) -> list[int] | None:
        """The tokens each text is as the model reads it (special tokens included), for the
        server to refuse what would be cut to ``max_len``; None where nothing is cut (a
        language model's context slides)."""
        return None

    def new_engine(self, config: EngineConfig, fast_prefill: bool | None = None) -> Engine:
        """Another engine over the run's model, sized by ``config`` (the server runs its own,
        in the thread of its models); ``fast_prefill``: its prompts widened or not (None:
        as the run was loaded)."""
        tok = self.target_tokenizer or self.source_tokenizer
        if self.kv_cache and config.cache_dtype is None:
            config = dataclasses.replace(config, cache_dtype=KV_CACHE[self.kv_cache])
        if self.fast_prefill if fast_prefill is None else fast_prefill:
            config = dataclasses.replace(config, bf16_prefill=True)
        engine = Engine(self.model, bos_id=tok.bos_id, eos_id=tok.eos_id, config=config)
        engine.runner.compiled = self.compiled  # its decode steps compiled (engine/compiled.py)
        return engine

    def __getattr__(self, name: str):
        """Only reached for a name this class lacks: another family's method is a clear
        error naming the kind of run it needs."""
        owner = None if name.startswith("_") else owner_of(name)
        if owner is not None:
            raise WrongModel(f"{self.run_dir} holds {self.describes}; {name} needs {owner}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def data_files(self, split: str, cache: Path) -> list[str]:
        """The files of the run's ``[data]`` valid or test split (a registry dataset's are
        prepared in ``cache`` first); an error if it names none."""
        files = split_files(self.config.data, split, cache)
        if not files:
            raise ValueError(f"{self.run_dir} names no [data] {split} files; pass --data FILE")
        return list(files)

    def params(self, decode: DecodeConfig, *, seed: int | None = None,
               search: bool = False) -> Params:
        """The engine's decoding settings of one request: ``decode``'s, sampling with
        ``seed``; with ``search`` (translation), beam search when ``decode`` asks for more than
        one hypothesis, else greedy search."""
        if search:  # a translation: beam search, or greedy; never sampled
            beam = decode.beam if max(decode.beam, decode.n_best) > 1 else 0
            return Params(max_new_tokens=decode.max_new_tokens, rules=Rules.of(decode),
                          beam=beam, n_best=decode.n_best,
                          length_penalty=decode.length_penalty)
        return Params(max_new_tokens=decode.max_new_tokens, temperature=decode.temperature,
                      top_k=decode.top_k, top_p=decode.top_p, seed=seed,
                      rules=Rules.of(decode), speculate=decode.speculate)

    def decode_options(self, **given) -> DecodeConfig:
        """The run's ``[decode]`` with the options given (None = keep), checked."""
        return self.config.decode.replace(**{k: v for k, v in given.items() if v is not None})

    def set_decode(self, **given) -> None:
        """The run's ``[decode]`` defaults changed for as long as it is loaded (a command's
        flags for all its requests: ``vaswani serve --speculate``), checked."""
        self.config = dataclasses.replace(self.config, decode=self.decode_options(**given))

    # --- what every run does -------------------------------------------------------------
    def evaluate(self, paths: list[str], *, beam: int | None = None,
                 outputs: list[str] | None = None) -> dict:
        """The task's scores on data files in the format the run trained on. ``outputs``, a
        list, receives what the model produced for each example (translations, predicted
        labels), in order."""
        report = ReadReport(max_skip=self.config.data.max_skip)
        result = {"task": self.task.name, **self.score(self.task.read(paths, report),
                                                       beam=beam, outputs=outputs)}
        if report.summary():
            result["data_notes"] = report.summary()
        return result

    def score(self, examples, *, beam: int | None = None,
              outputs: list[str] | None = None) -> dict:
        """The family's scores on examples as the task reads them."""
        raise NotImplementedError

    def attention(self, text: str, target: str | None = None) -> dict[str, dict]:
        """Every layer's and head's attention weights for one input: {kind: {"weights":
        (L, H, Tq, Tk), "queries": [...], "keys": [...]}}."""
        raise NotImplementedError

    def output_probabilities(self, text: str, target: str | None = None) -> list[dict]:
        """What the model predicts for one input, for the attention explorer: each output
        token (or class) with its probability, ``[{"token": str, "p": float | None}]``."""
        raise NotImplementedError

    def explained_target(self, text: str, target: str | None) -> str | None:
        """The output the explorer explains: ``target`` as given (a translator without one
        explains its own greedy translation)."""
        return target

    def attention_view(self, text: str, target: str | None = None) -> dict:
        """Everything the attention explorer shows for one input, as plain JSON-able data:
        each kind's (layers, heads, queries, keys) weights rounded to 4 decimals, the token
        labels, and each output token's (or class's) probability."""
        target = self.explained_target(text, target)
        maps = self.attention(text, target)
        return {"task": self.task.name, "input": text, "target": target,
                "attention": {kind: {"weights": m["weights"].numpy().round(4).tolist(),
                                     "queries": m["queries"], "keys": m["keys"],
                                     "layers": int(m["weights"].shape[0]),
                                     "heads": int(m["weights"].shape[1])}
                              for kind, m in maps.items()},
                "probabilities": self.output_probabilities(text, target)}


def owner_of(method: str) -> str | None:
    """What kind of run has ``method``, in words (``"translate"`` -> "a translation model
    (encoder-decoder)"), if any: a family's use class, else a task's own."""
    for f in families().values():
        if callable(getattr(f.use, method, None)):
            return f.describes
    for cls in Run.registry.values():
        if callable(getattr(cls, method, None)) and isinstance(cls.describes, str):
            return cls.describes
    return None


def load(run_dir: str | Path, *, device: str = "cpu", weights: str = "best",
         quantize: str | None = None, compiled: bool | None = None,
         kv_cache: str | None = None, fast_prefill: bool | None = None,
         workers: int = 1) -> Run:
    """Load a run directory written by ``vaswani train`` (or ``vaswani import``) as the use
    class of its task. ``weights``: ``"best"`` (model.safetensors), ``"last"`` (the latest
    checkpoint) or ``"averaged"`` (averaged.safetensors, from ``vaswani average``).
    ``quantize``: every linear layer with int8 or int4 weights (cpu/quantized.py; a CPU only):
    ``"int8"`` (a language model keeps float inputs; a translator or an encoder quantizes
    them too, per call), ``"int4"`` (language models: 4-bit weights in groups, float inputs);
    a language model's token table in int8 rows either way. ``compiled``: decode with the
    step ``vaswani compile`` built for this run, quantization and machine (on a CPU; None:
    if there is one, True: it must be there, False: eagerly, whatever is there).
    ``kv_cache="bf16"``: the decoder's keys and values kept in bfloat16 (half the memory a
    token; engine/config.py ``EngineConfig.cache_dtype``), and the compiled step built for
    that cache. ``fast_prefill``: an int8 language model's prompts multiplied in bfloat16
    (faster; the int8 kernel's arithmetic up to one rounding: ``EngineConfig.bf16_prefill``):
    None, where the CPU has bfloat16 products; False, never; True, asked for (refused for
    anything else, a warning on a CPU without them). ``workers``: a translator's offline calls
    (``translate``, ``score``, ``evaluate``) split across this many processes on a CPU, each
    with its own copy of the run and an equal share of torch's threads (workers.py)."""
    run_dir = Path(run_dir)
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers ({workers!r}) must be a whole number >= 1")
    if quantize is not None and quantize not in QUANTIZE:
        raise ValueError(f"quantize ({quantize!r}) must be one of {', '.join(QUANTIZE)}")
    if kv_cache is not None and kv_cache not in KV_CACHE:
        raise ValueError(f"kv_cache ({kv_cache!r}) must be one of {', '.join(KV_CACHE)} "
                         "(or None: the model's dtype)")
    dev = resolve_device(device)
    if quantize and dev.type != "cpu":
        raise ValueError(f"--quantize {quantize} runs on a CPU (PyTorch's {quantize} "
                         f"kernels); the device asked for is {dev}")
    config = rundir.read_config(run_dir)
    kind = family(config.model.arch)
    use = Run.registry.get(task_for(config).name) or kind.use
    source, target, labels = rundir.read_tokenizers(run_dir)
    for name, tok, expected in [("source", source, config.model.vocab_size),
                                ("target", target, config.model.tgt_vocab_size)]:
        if tok is not None and tok.vocab_size != expected:
            raise ValueError(f"the {name} tokenizer in {run_dir / rundir.TOKENIZER} has "
                             f"{tok.vocab_size} tokens but the model expects {expected}: "
                             "the tokenizer does not belong to this model")
    language_model = kind.language_model
    if quantize in INT4_GROUPS and not language_model:
        raise ValueError(f"--quantize {quantize} is for language models; {run_dir} holds "
                         f"{kind.describes}: use --quantize int8")
    widens = language_model and quantize == "int8"
    if fast_prefill and not widens:
        raise ValueError(f"--fast-prefill is for a language model's int8 weights (--quantize "
                         f"int8); {run_dir} holds {kind.describes}, --quantize {quantize}")
    if fast_prefill and not bf16_products():
        warnings.warn("--fast-prefill: this CPU has no bfloat16 matrix products (AVX512-BF16 "
                      "or AMX); prompts keep the int8 kernel", stacklevel=2)
    path = checkpoint.weights_path(run_dir, weights)
    if weights == "best" and path.parent != run_dir:
        warnings.warn(f"{run_dir} has no best weights ({rundir.BEST}: no evaluation kept "
                      f"one); using its latest checkpoint, {path.parent.name}/", stacklevel=2)
    if config.finetune.lora:  # adapters: merged into their base's weights, then as any run
        model = adapted(run_dir, config, path, fast=dev.type == "cpu").eval()
        model = quantize_linears(model, quantize, weight_only=language_model) if quantize \
            else model.to(dev)
    elif quantize:  # each linear layer quantized as it is read: no whole float model in memory
        model = build_model(config.model, device="meta")
        # a language model's outputs must not depend on their batch: float inputs
        load_quantized(model, path, quantize, weight_only=language_model)
        fill_buffers(model)  # the tables no file holds (sinusoidal positions)
        model.eval()
    else:
        model = build_model(config.model, initialise=False,  # its weights are loaded next
                            fast=dev.type == "cpu")  # a CPU's paths where it runs on one
        checkpoint.load_weights(model, path)
        model.to(dev).eval()
    run = use(run_dir, config, model, source, target, labels, dev)
    run.kv_cache = kv_cache
    run.fast_prefill = (widens and bf16_products()) if fast_prefill is None else fast_prefill
    if compiled is not False and kind.decoder and dev.type == "cpu":
        run.compiled = compiled_step(run_dir, path, quantize, required=bool(compiled),
                                     kv_cache=kv_cache)
    elif compiled:
        raise ValueError(f"a compiled decode step is for a run that decodes on a CPU; {run_dir} "
                         f"holds {kind.describes}" + (f", on {dev}" if dev.type != "cpu" else ""))
    if workers > 1:
        if not kind.cross or dev.type != "cpu":
            raise ValueError(f"workers split a translator's offline calls on a CPU; {run_dir} "
                             f"holds {kind.describes}" + (f", on {dev}" if dev.type != "cpu"
                                                          else ""))
        run.workers = Workers(workers, dict(
            run_dir=str(run_dir), weights=weights, quantize=quantize, kv_cache=kv_cache,
            compiled=run.compiled is not None, fast_prefill=fast_prefill), torch.get_num_threads())
    return run


def compiled_step(run_dir: Path, weights: Path, quantize: str | None, *,
                  required: bool, kv_cache: str | None = None) -> CompiledStep | None:
    """The package built for this run, ``weights`` file, quantization, key/value cache and
    machine, or None (a package built for something else is named in a warning).
    ``required``: None is an error that says how to build one."""
    found = None
    if package_path(run_dir, quantize, kv_cache).exists():  # (no code digest for a run without)
        found = load_compiled(run_dir, identity(run_dir, weights, quantize, kv_cache), quantize,
                              lambda message: warnings.warn(message, stacklevel=6), kv_cache)
    if found is None and required:
        cache = f" and a {kv_cache} key/value cache" if kv_cache else ""
        raise FileNotFoundError(
            f"{run_dir} has no compiled decode step for {quantize or 'float'} weights{cache} "
            f"on this machine; build it with `vaswani compile {run_dir}"
            f"{options(quantize, kv_cache)}`")
    return found


# --- helpers the use classes share --------------------------------------------------------------

def encode_inputs(tokenizer: Tokenizer, texts: list[str], max_len: int, *, bos: bool = False,
                  eos: bool = False) -> list[list[int]]:
    """Token ids per text (with ``bos``/``eos`` if asked), cut to ``max_len`` with a warning
    that names the limit."""
    limit = max_len - int(bos) - int(eos)
    out, cut = [], []
    for i, ids in enumerate(tokenizer.encode_batch(texts)):
        if len(ids) > limit:
            cut.append((i, len(ids)))
            ids = ids[:limit]
        out.append(([tokenizer.bos_id] if bos else []) + ids + ([tokenizer.eos_id] if eos else []))
    if cut:
        i, n = max(cut, key=lambda c: c[1])
        warnings.warn(f"{len(cut)} of {len(texts)} input(s) were longer than the model's "
                      f"max_len ({max_len} tokens) and were truncated (the longest, input "
                      f"{i + 1}, had {n})", stacklevel=3)
    return out
