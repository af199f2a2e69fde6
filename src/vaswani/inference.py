"""Using a trained run from Python: ``vaswani.load(RUN_DIR)``.

    >>> run = vaswani.load("runs/copy")
    >>> run.translate(["abcde"], beam=4)
    ['abcde']

The object knows its task from the run's config and offers ``translate`` (encoder-decoder),
``generate`` (decoder) and ``classify`` (encoder). Inputs longer than the model's ``max_len``
are truncated with a warning naming the limit.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from .config import RunConfig, load_run_config
from .data.batching import pad
from .data.datasets import TASKS, classifier_input
from .data.tokenizers import Tokenizer, load_tokenizers
from .generation import beam_decode, generate, greedy_decode
from .models import build_model
from .training.checkpoint import find_last, load_weights


class Run:
    """A trained model with its tokenizers, labels and decoding settings."""

    def __init__(self, run_dir: Path, config: RunConfig, model: torch.nn.Module,
                 source_tokenizer: Tokenizer, target_tokenizer: Tokenizer | None,
                 labels: list[str], device: torch.device) -> None:
        self.run_dir, self.config, self.model = run_dir, config, model
        self.source_tokenizer, self.target_tokenizer = source_tokenizer, target_tokenizer
        self.labels, self.device = labels, device

    @property
    def task(self) -> str:
        return TASKS[self.config.model.arch]

    def _require(self, task: str, what: str) -> None:
        if self.task != task:
            raise ValueError(f"{self.run_dir} holds a {self.config.model.arch} model "
                             f"({self.task}); {what} needs a {task} model")

    def encode(self, texts: list[str], *, bos: bool = False, eos: bool = False,
               tokenizer: Tokenizer | None = None) -> list[list[int]]:
        """Token ids per text, cut to the model's max_len (with a warning)."""
        tokenizer = tokenizer or self.source_tokenizer
        limit = self.config.model.max_len - int(bos) - int(eos)
        out, cut = [], []
        for i, ids in enumerate(tokenizer.encode_batch(texts)):
            if len(ids) > limit:
                cut.append((i, len(ids)))
                ids = ids[:limit]
            out.append(([tokenizer.bos_id] if bos else []) + ids
                       + ([tokenizer.eos_id] if eos else []))
        if cut:
            i, n = max(cut, key=lambda c: c[1])
            warnings.warn(f"{len(cut)} of {len(texts)} input(s) were longer than the model's "
                          f"max_len ({self.config.model.max_len} tokens) and were truncated "
                          f"(the longest, input {i + 1}, had {n})", stacklevel=2)
        return out

    @torch.no_grad()
    def translate(self, texts: list[str], *, beam: int | None = None, n_best: int = 1,
                  length_penalty: float | None = None, batch_size: int = 64
                  ) -> list[str] | list[list[tuple[str, float]]]:
        """Translate each text. ``beam=1`` is greedy. With ``n_best > 1``, each result is a
        list of (translation, score), best first. Empty texts give empty results."""
        self._require("translation", "translate")
        d = self.config.decode
        beam = d.beam if beam is None else beam
        alpha = d.length_penalty if length_penalty is None else length_penalty
        results: list = [[("", 0.0)] * n_best if n_best > 1 else "" for _ in texts]
        todo = [i for i, t in enumerate(texts) if t.strip()]
        ids = dict(zip(todo, self.encode([texts[i] for i in todo], eos=True), strict=True))
        order = sorted(todo, key=lambda i: len(ids[i]))  # similar lengths batch together
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            src = pad([ids[i] for i in chunk]).to(self.device)
            target = self.target_tokenizer
            common = dict(bos_id=target.bos_id, eos_id=target.eos_id, max_len_a=d.max_len_a,
                          max_len_b=d.max_len_b)
            if beam == 1 and n_best == 1:
                outs = [[(o, 0.0)] for o in greedy_decode(self.model, src, **common)]
            else:
                outs = beam_decode(self.model, src, beam=beam, alpha=alpha, n_best=n_best,
                                   **common)
            for i, hyps in zip(chunk, outs, strict=True):
                decoded = [(self.target_tokenizer.decode(h), score) for h, score in hyps]
                results[i] = decoded if n_best > 1 else decoded[0][0]
        return results

    @torch.no_grad()
    def generate(self, prompt: str, *, max_new_tokens: int | None = None,
                 temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None,
                 stream: Callable[[str], None] | None = None) -> str:
        """Continue ``prompt``; ``stream(text)`` receives the new text as it is produced."""
        self._require("lm", "generate")
        d = self.config.decode
        tok = self.source_tokenizer
        prompt_ids = tok.encode(prompt)
        new: list[int] = []
        printed = ""

        def on_token(i: int) -> None:
            nonlocal printed
            new.append(i)
            text = tok.decode(new)
            if stream is not None and not text.endswith("\ufffd"):  # wait for whole characters
                stream(text[len(printed):])
                printed = text

        out = generate(self.model, prompt_ids, bos_id=tok.bos_id, eos_id=tok.eos_id,
                       max_new_tokens=d.max_new_tokens if max_new_tokens is None
                       else max_new_tokens,
                       temperature=d.temperature if temperature is None else temperature,
                       top_k=d.top_k if top_k is None else top_k,
                       top_p=d.top_p if top_p is None else top_p, seed=seed, on_token=on_token)
        text = tok.decode(out)
        if stream is not None and len(text) > len(printed):
            stream(text[len(printed):])
        return text

    @torch.no_grad()
    def classify(self, texts: list[str], batch_size: int = 64) -> list[tuple[str, float]]:
        """(label, probability) of the most likely class for each text."""
        self._require("classification", "classify")
        encoded = self._classifier_inputs(texts)
        out = []
        for start in range(0, len(texts), batch_size):
            ids = pad(encoded[start:start + batch_size], self.source_tokenizer.pad_id)
            ids = ids.to(self.device)
            probs = self.model(ids).float().softmax(-1)
            p, k = probs.max(-1)
            out.extend((self.labels[int(i)], float(q)) for i, q in zip(k, p, strict=True))
        return out

    def _classifier_inputs(self, texts: list[str]) -> list[list[int]]:
        limit = self.config.model.max_len
        pairs = [classifier_input(self.source_tokenizer, t, limit) for t in texts]
        cut = sum(c for _, c in pairs)
        if cut:
            warnings.warn(f"{cut} of {len(texts)} input(s) were longer than the model's max_len "
                          f"({limit} tokens) and were truncated", stacklevel=3)
        return [ids for ids, _ in pairs]

    @torch.no_grad()
    def embed(self, texts: list[str], batch_size: int = 32) -> torch.Tensor:
        """Sentence embeddings (N, D): the encoder's hidden states averaged over each text's
        tokens (padding excluded) and L2-normalised. Texts are batched by length."""
        if self.config.model.arch != "encoder":
            raise ValueError(f"{self.run_dir} holds a {self.config.model.arch} model; "
                             "embed needs an encoder (e.g. an imported BERT)")
        tok = self.source_tokenizer
        encoded = self._classifier_inputs(texts)
        out = torch.zeros(len(texts), self.config.model.d_model)
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            ids = pad([encoded[i] for i in chunk], tok.pad_id).to(self.device)
            lengths = torch.tensor([len(encoded[i]) for i in chunk], device=self.device)
            mask = torch.arange(ids.size(1), device=self.device) < lengths[:, None]
            hidden = self.model.encode(ids, mask=mask)
            out[chunk] = self.model.sentence_embeddings(hidden, mask).float().cpu()
        return out


def load(run_dir: str | Path, *, device: str = "cpu", weights: str = "best") -> Run:
    """Load a run directory written by ``vaswani train``. ``weights``: ``"best"``
    (model.safetensors) or ``"last"`` (the latest checkpoint)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.toml").exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.toml); "
                                "train one with `vaswani train CONFIG.toml --out RUN_DIR`")
    config = load_run_config(run_dir / "config.toml")
    source, target = load_tokenizers(run_dir / "tokenizer")
    for name, tok, expected in [("source", source, config.model.vocab_size),
                                ("target", target, config.model.target_vocab_size)]:
        if tok is not None and tok.vocab_size != expected:
            raise ValueError(f"the {name} tokenizer in {run_dir / 'tokenizer'} has "
                             f"{tok.vocab_size} tokens but the model expects {expected}: "
                             "the tokenizer does not belong to this model")
    if weights == "best" and (run_dir / "model.safetensors").exists():
        path = run_dir / "model.safetensors"
    elif weights in ("best", "last"):
        path = find_last(run_dir) / "model.safetensors"
    else:
        raise ValueError(f"weights ({weights!r}) must be 'best' or 'last'")
    model = build_model(config.model)
    load_weights(model, path)
    dev = torch.device(device)
    model.to(dev).eval()
    meta = json.loads((run_dir / "tokenizer" / "meta.json").read_text())
    return Run(run_dir, config, model, source, target, meta.get("labels", []), dev)
