"""Using a trained run from Python: ``vaswani.load(RUN_DIR)``.

    >>> run = vaswani.load("runs/copy")
    >>> run.translate(["abcde"], beam=4)
    ['abcde']

A :class:`Run` is a run directory loaded: the model, its tokenizers, its labels and its
config. Its methods are the entry points of the run's task (tasks/): ``translate``
(encoder-decoder), ``generate`` (decoder), ``classify`` and ``embed`` (encoder),
``evaluate`` and ``attention`` (any). Decoding options left out come from the run's
``[decode]`` section and are checked there, so a bad value fails with the field named.
Inputs longer than the model's ``max_len`` are truncated with a warning naming the limit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from . import checkpoint, rundir
from .config import DecodeConfig, RunConfig
from .data.tokenizers import Tokenizer
from .devices import resolve_device
from .models import build_model
from .tasks import Task, task_for


class Run:
    """A trained model with its tokenizers, labels and decoding settings."""

    def __init__(self, run_dir: Path, config: RunConfig, model: torch.nn.Module,
                 source_tokenizer: Tokenizer, target_tokenizer: Tokenizer | None,
                 labels: list[str], device: torch.device) -> None:
        self.run_dir, self.config, self.model = run_dir, config, model
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        self.labels, self.device = labels, device
        self.task_object: Task = task_for(config)
        self.chat_template: str | None = rundir.read_chat_template(run_dir)

    @property
    def task(self) -> str:
        """"translation", "lm" or "classification"."""
        return self.task_object.name

    def _require(self, task: str, what: str) -> Task:
        if self.task != task:
            raise ValueError(f"{self.run_dir} holds a {self.config.model.arch} model "
                             f"({self.task}); {what} needs a {task} model")
        return self.task_object

    def decode_options(self, **given) -> DecodeConfig:
        """The run's ``[decode]`` with the options given (None = keep), checked."""
        return self.config.decode.replace(**{k: v for k, v in given.items() if v is not None})

    def translate(self, texts: list[str], *, beam: int | None = None, n_best: int = 1,
                  length_penalty: float | None = None, batch_size: int = 64, **controls
                  ) -> list[str] | list[list[tuple[str, float]]]:
        """Translate each text. ``beam=1`` is greedy. With ``n_best > 1``, each result is a
        list of (translation, score), best first. Empty texts give empty results.
        ``controls``: any ``[decode]`` option (``no_repeat_ngram_size``,
        ``repetition_penalty``, ``min_length``, ``max_len_a``, ...)."""
        task = self._require("translation", "translate")
        decode = self.decode_options(beam=beam, n_best=n_best, length_penalty=length_penalty,
                                     **controls)
        results = task.translate(self, texts, decode, batch_size=batch_size)
        return results if n_best > 1 else [best[0][0] for best in results]

    def generate(self, prompt: str, *, max_new_tokens: int | None = None,
                 temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None,
                 stream: Callable[[str], None] | None = None, **controls) -> str:
        """Continue ``prompt``; ``stream(text)`` receives the new text as it is produced.
        ``controls``: any ``[decode]`` option (``stop``, ``repetition_penalty``,
        ``no_repeat_ngram_size``, ``min_length``, ``presence_penalty``, ...)."""
        task = self._require("lm", "generate")
        decode = self.decode_options(max_new_tokens=max_new_tokens, temperature=temperature,
                                     top_k=top_k, top_p=top_p, **controls)
        return task.generate(self, prompt, decode, seed=seed, stream=stream)

    def classify(self, texts: list[str], batch_size: int = 64) -> list[tuple[str, float]]:
        """(label, probability) of the most likely class for each text."""
        task = self._require("classification", "classify")
        return task.classify(self, texts, batch_size=batch_size)

    def embed(self, texts: list[str], batch_size: int = 32) -> torch.Tensor:
        """Sentence embeddings (N, D): the encoder's hidden states averaged over each text's
        tokens (padding excluded) and L2-normalised."""
        if self.task != "classification":
            raise ValueError(f"{self.run_dir} holds a {self.config.model.arch} model; "
                             "embed needs an encoder (e.g. an imported BERT)")
        return self.task_object.embed(self, texts, batch_size=batch_size)

    def evaluate(self, paths: list[str], *, beam: int | None = None,
                 outputs: list[str] | None = None) -> dict:
        """The task's scores on data files in the format the run trained on. ``outputs``, a
        list, receives what the model produced for each example (translations, predicted
        labels), in order."""
        return self.task_object.evaluate(self, paths, beam=beam, outputs=outputs)

    def attention(self, text: str, target: str | None = None) -> dict[str, dict]:
        """Every layer's and head's attention weights for one input: {kind: {"weights":
        (L, H, Tq, Tk), "queries": [...], "keys": [...]}}."""
        return self.task_object.attention(self, text, target)


    def attention_view(self, text: str, target: str | None = None) -> dict:
        """Everything the attention explorer shows for one input, as plain JSON-able data:
        each kind's (layers, heads, queries, keys) weights rounded to 4 decimals, the token
        labels, and each output token's (or class's) probability. A translator with no
        ``target`` explains its own greedy translation."""
        if self.task == "translation" and target is None:
            target = self.translate([text], beam=1)[0]
        maps = self.attention(text, target)
        return {"task": self.task, "input": text, "target": target,
                "attention": {kind: {"weights": m["weights"].numpy().round(4).tolist(),
                                     "queries": m["queries"], "keys": m["keys"],
                                     "layers": int(m["weights"].shape[0]),
                                     "heads": int(m["weights"].shape[1])}
                              for kind, m in maps.items()},
                "probabilities": self.task_object.output_probabilities(self, text, target)}


def load(run_dir: str | Path, *, device: str = "cpu", weights: str = "best") -> Run:
    """Load a run directory written by ``vaswani train`` (or ``vaswani import``).
    ``weights``: ``"best"`` (model.safetensors) or ``"last"`` (the latest checkpoint)."""
    run_dir = Path(run_dir)
    dev = resolve_device(device)
    config = rundir.read_config(run_dir)
    source, target, labels = rundir.read_tokenizers(run_dir)
    for name, tok, expected in [("source", source, config.model.vocab_size),
                                ("target", target, config.model.tgt_vocab_size)]:
        if tok is not None and tok.vocab_size != expected:
            raise ValueError(f"the {name} tokenizer in {run_dir / rundir.TOKENIZER} has "
                             f"{tok.vocab_size} tokens but the model expects {expected}: "
                             "the tokenizer does not belong to this model")
    model = build_model(config.model)
    checkpoint.load_weights(model, checkpoint.weights_path(run_dir, weights))
    model.to(dev).eval()
    return Run(run_dir, config, model, source, target, labels, dev)
