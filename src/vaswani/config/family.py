"""A model family (``[model] arch``): one record of what it is made of and what builds,
trains, uses and serves it, read by every layer that used to keep a list of its own.

The three built in are written out together in ``inference/families.py`` (the one layer
that sees a model class, a task and a use class at once); a family from outside is one more
record given to :func:`register` (``tests/test_families.py`` adds a toy one)::

    register(Family(name="toy", encoder=False, decoder=True, classes=False,
                    model=ToyLM, task=ToyTask, use=ToyRun, routes=("completions",),
                    describes="a toy language model", action="generate",
                    summary="toy: continues your text"))

The structure fields (``encoder``, ``decoder``, ``classes``) are what the config's rules,
its parameter count, warm starts and quantization read, instead of testing names.

The three built-in records are loaded on the first lookup (:func:`families`), not when this
module is imported: ``import vaswani.nn`` or ``vaswani.config`` loads no model, task or use
class until a family is asked for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One model family: what its model is made of, the classes that build, train and use
    it, the server routes its runs answer and the words said of it."""

    name: str  # the [model] arch that picks it
    # what the model is made of
    encoder: bool  # an encoder stack reads the whole input, both ways
    decoder: bool  # a causal decoder stack predicts the next token (over the encoder's
    #                output too when both are there: cross-attention)
    classes: bool  # a classification head over the encoder (``n_classes``; 0 = embeddings)
    # what builds, trains and uses it
    model: type  # the nn.Module built from a ModelConfig (models/)
    task: type  # the Task a config of this arch trains unless [data] task says (tasks/)
    use: type  # the Run class a trained run loads as (inference/)
    routes: tuple[str, ...]  # the server's /v1 routes its runs answer
    # words: the CLI's and the server's messages, the page
    describes: str  # "a translation model (encoder-decoder)"
    action: str  # what the page does with one: "translate", "generate", "classify"
    summary: str  # the page's line about it

    @property
    def cross(self) -> bool:
        """The decoder attends to the encoder's output (a translator)."""
        return self.encoder and self.decoder

    @property
    def language_model(self) -> bool:
        """A decoder alone: it continues text."""
        return self.decoder and not self.encoder


FAMILIES: dict[str, Family] = {}
BUILT_IN = "vaswani.inference.families"  # the module that writes out the three records


def families() -> dict[str, Family]:
    """Every family, by name: the built-in three (loaded from :data:`BUILT_IN` the first
    time) and those given to :func:`register`."""
    importlib.import_module(BUILT_IN)
    return FAMILIES


def register(family: Family) -> Family:
    """Make ``family`` known by its name (a second record of a name replaces the first)."""
    FAMILIES[family.name] = family
    return family


def family(arch: str) -> Family:
    """The family of ``[model] arch``; a ValueError naming the known ones otherwise."""
    if arch not in families():
        raise ValueError(f"arch ({arch!r}) must be one of {', '.join(map(repr, FAMILIES))}")
    return FAMILIES[arch]


def named(where) -> str:
    """The archs whose family ``where(family)`` holds, for a message: "'encoder'"."""
    return " or ".join(repr(f.name) for f in families().values() if where(f)) or "none"


def serving(route: str) -> Family | None:
    """The first family whose runs answer ``route``."""
    return next((f for f in families().values() if route in f.routes), None)
