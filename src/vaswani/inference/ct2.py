"""A CTranslate2 export (a folder written by ``vaswani export --format ct2``) used like a
vaswani run: ``vaswani.load(DIR, engine="ct2")`` gives a :class:`CT2Translator` or a
:class:`CT2LanguageModel` whose ``translate`` / ``generate`` take the options of
:class:`~vaswani.inference.Translator` / :class:`~vaswani.inference.LanguageModel`, run by
CTranslate2 with the run's own tokenizer and ``[decode]`` defaults (kept in the export under
``vaswani/``). An option CTranslate2 has no counterpart for is refused by name.

Beam scores are CTranslate2's: the sum of the tokens' log-probabilities (``<eos>`` included)
divided by ``length ** length_penalty`` (not GNMT's ``((5 + length) / 6) ** alpha``, which
vaswani's own beam search uses); with ``length_penalty=0`` both are the raw log-probability.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from .. import rundir
from ..config.family import family
from ..data.tokenizers import token_strings
from .base import WrongModel, encode_inputs

SOURCE = "vaswani"  # the folder, inside an export, that holds the run's config and tokenizer


class CT2Run:
    """The export's model, tokenizers and config."""

    describes = "a CTranslate2 export"

    def __init__(self, folder: str | Path, *, device: str = "cpu",
                 compute_type: str = "default", threads: int = 0) -> None:
        import ctranslate2

        self.folder = Path(folder)
        self.config = rundir.read_config(self.folder / SOURCE)
        self.source, target, _ = rundir.read_tokenizers(self.folder / SOURCE)
        self.target = target or self.source
        self.source_tokens = token_strings(self.source)
        self.index = {t: i for i, t in enumerate(token_strings(self.target))}
        names = token_strings(self.target)  # vaswani never outputs <pad> or <bos>
        self.never = [[names[self.target.pad_id]], [names[self.target.bos_id]]]
        engine = (ctranslate2.Translator if family(self.config.model.arch).cross
                  else ctranslate2.Generator)
        self.model = engine(str(self.folder), device=device, compute_type=compute_type,
                            intra_threads=threads)  # 0: CTranslate2's default
        # exports before add_source_eos was written leave <eos> to the caller
        settings = json.loads((self.folder / "config.json").read_text())
        self.adds_source_eos = bool(settings.get("add_source_eos", False))

    def __getattr__(self, name: str):
        for cls in (CT2Translator, CT2LanguageModel):
            if name in cls.__dict__ and not isinstance(self, cls):
                raise WrongModel(f"{self.folder} holds {self.describes}; {name} needs "
                                 f"{cls.describes}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _text(self, tokens: list[str]) -> str:
        return self.target.decode([self.index[t] for t in tokens])


def refuse_options(**given) -> None:
    """Options vaswani has and CTranslate2 does not: refused by name when given."""
    for name, value in given.items():
        if value:
            raise ValueError(f"--{name.replace('_', '-')} is not available with --engine ct2")


class CT2Translator(CT2Run):
    describes = "a CTranslate2 translator"

    def translate(self, texts: list[str], *, beam: int | None = None, n_best: int = 1,
                  length_penalty: float | None = None, repetition_penalty: float | None = None,
                  no_repeat_ngram_size: int | None = None, min_length: int | None = None,
                  batch_size: int = 64) -> list[str] | list[list[tuple[str, float]]]:
        """Like ``Translator.translate``: each text's translation, or with ``n_best > 1`` its
        ``n_best`` best (translation, score), best first."""
        d = self.config.decode
        beam = beam or d.beam
        results = [[("", 0.0)] * n_best for _ in texts]
        todo = [i for i, t in enumerate(texts) if t.strip()]
        ids = encode_inputs(self.source, [texts[i] for i in todo], self.config.model.max_len,
                            eos=True)
        # vaswani's cap per sentence (its <eos> counted); CTranslate2 takes one per call, so
        # sentences are grouped by it. Past max_len there are no positions.
        groups: dict[int, list[int]] = {}
        for k, x in enumerate(ids):
            cap = min(int(d.max_len_a * len(x) + d.max_len_b), self.config.model.max_len - 1)
            groups.setdefault(cap, []).append(k)
        if self.adds_source_eos:  # CTranslate2 appends it, as a CT2 user's call would
            ids = [x[:-1] for x in ids]
        for cap, members in sorted(groups.items()):
            for start in range(0, len(members), batch_size):
                chunk = members[start:start + batch_size]
                out = self.model.translate_batch(
                    [[self.source_tokens[i] for i in ids[k]] for k in chunk], beam_size=beam,
                    num_hypotheses=n_best, return_scores=True,
                    length_penalty=d.length_penalty if length_penalty is None
                    else length_penalty,
                    max_decoding_length=cap, repetition_penalty=repetition_penalty or 1.0,
                    no_repeat_ngram_size=no_repeat_ngram_size or 0,
                    min_decoding_length=min_length or 0, suppress_sequences=self.never)
                for k, r in zip(chunk, out, strict=True):
                    results[todo[k]] = [(self._text(h), s)
                                        for h, s in zip(r.hypotheses, r.scores, strict=True)]
        return results if n_best > 1 else [best[0][0] for best in results]


class CT2LanguageModel(CT2Run):
    describes = "a CTranslate2 language model"

    def generate(self, prompt: str, *, stream: Callable[[str], None] | None = None,
                 **options) -> str:
        """Like ``LanguageModel.generate``: the continuation of ``prompt`` (greedy at
        temperature 0); ``stream`` receives it whole, at the end. ``options``: those of
        :meth:`generate_many`."""
        text = self.generate_many([prompt], **options)[0]
        if stream is not None:
            stream(text)
        return text

    def generate_many(self, prompts: list[str], *, max_new_tokens: int | None = None,
                      temperature: float | None = None, top_k: int | None = None,
                      top_p: float | None = None, seed: int | None = None,
                      repetition_penalty: float | None = None,
                      no_repeat_ngram_size: int | None = None, min_length: int | None = None,
                      stop=None, presence_penalty=None, frequency_penalty=None,
                      batch_size: int = 64) -> list[str]:
        """Each prompt's continuation, in batches (CTranslate2's ``generate_batch``)."""
        import ctranslate2

        refuse_options(stop=stop, presence_penalty=presence_penalty,
                       frequency_penalty=frequency_penalty)
        d = self.config.decode
        temperature = d.temperature if temperature is None else temperature
        if seed is not None:
            ctranslate2.set_random_seed(seed)
        greedy = temperature == 0
        starts = [[self.source_tokens[i] for i in (self.source.encode(p) or [self.source.bos_id])]
                  for p in prompts]
        # CTranslate2 has no sliding window: prompt and continuation share the max_len
        # positions, so each prompt gets the new tokens that fit (vaswani slides instead)
        wanted, max_len = max_new_tokens or d.max_new_tokens, self.config.model.max_len
        groups: dict[int, list[int]] = {}
        for i, start in enumerate(starts):
            if len(start) >= max_len:
                raise ValueError(f"prompt {i + 1} has {len(start)} tokens, the model's max_len "
                                 f"is {max_len}: CTranslate2 cannot slide the window; shorten "
                                 "the prompt or use vaswani's own engine")
            groups.setdefault(min(wanted, max_len - len(start)), []).append(i)
        out = [""] * len(prompts)
        for length, members in sorted(groups.items()):
            for first in range(0, len(members), batch_size):
                chunk = members[first:first + batch_size]
                results = self.model.generate_batch(
                    [starts[i] for i in chunk], max_length=length,
                    include_prompt_in_result=False, suppress_sequences=self.never,
                    sampling_topk=1 if greedy else (top_k or d.top_k or 0),
                    sampling_topp=1.0 if greedy else (top_p or d.top_p or 1.0),
                    sampling_temperature=1.0 if greedy else temperature,
                    repetition_penalty=repetition_penalty or 1.0,
                    no_repeat_ngram_size=no_repeat_ngram_size or 0, min_length=min_length or 0,
                    end_token=self.source_tokens[self.source.eos_id])
                for i, r in zip(chunk, results, strict=True):
                    out[i] = self._text(r.sequences[0])
        return out


def load(folder: str | Path, *, device: str = "cpu", compute_type: str = "default",
         threads: int = 0) -> CT2Run:
    """The export in ``folder`` as a :class:`CT2Translator` or :class:`CT2LanguageModel`."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise ImportError("--engine ct2 needs CTranslate2: pip install 'vaswani[export]'") \
            from None
    folder = Path(folder)
    if not (folder / "model.bin").exists() or not (folder / SOURCE).is_dir():
        raise FileNotFoundError(f"{folder} is not a CTranslate2 export of a vaswani run (no "
                                f"model.bin and {SOURCE}/); make one with `vaswani export "
                                "RUN_DIR --format ct2 --out DIR`")
    arch = rundir.read_config(folder / SOURCE).model.arch
    cls = CT2Translator if family(arch).cross else CT2LanguageModel
    return cls(folder, device=device, compute_type=compute_type, threads=threads)
