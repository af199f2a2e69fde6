"""Translation: source -> target sentence pairs, for the encoder-decoder.

Data: one TSV file of ``source<TAB>target`` lines, or two aligned text files (see
data/files.py). Token layout: a source is ``tokens + <eos>``; a target is
``<bos> + tokens + <eos>``, and the model reads ``tgt[:-1]`` to predict ``tgt[1:]`` (teacher
forcing). Each side is cut to the model's ``max_len``. One tokenizer serves both sides when
``[data] shared_vocab`` (the default), else one each.

The loss is averaged over the non-padding target tokens; the validation metrics are exact
match, sacreBLEU and chrF of greedy translations. A trained translator is used through
inference/translator.py.
"""

from __future__ import annotations

import numpy as np
import torch

from ..data import files
from ..data.batching import Batch, BucketBatches, pad
from ..data.tokenizers import train_tokenizer
from ..engine import Engine, EngineConfig, Params, Request
from ..evaluation.metrics import bleu_chrf, exact_match
from .base import Task


class Translation(Task):
    name = "translation"
    arch = "encoder-decoder"
    metrics = ("valid_loss", "exact_match", "bleu", "chrf")

    def check_training_config(self):
        super().check_training_config()
        if self.config.model.share_embeddings and not self.config.data.shared_vocab:
            raise ValueError("[model] share_embeddings = true needs [data] shared_vocab = true: "
                             "with a vocabulary for each language, source token i and target "
                             "token i are different tokens and cannot share one embedding")

    # --- data ----------------------------------------------------------------------------
    FIELDS = {"src": "ragged", "tgt": "ragged"}

    def iter_examples(self, paths, report):
        return files.iter_translation(paths, report)

    def encoding_options(self):
        return {"shared_vocab": self.config.data.shared_vocab}

    def train_tokenizers_from(self, inputs, kind):
        d = self.config.data
        if d.shared_vocab:
            texts = (text for pair in inputs.train_examples() for text in pair)
            shared = train_tokenizer(kind, texts, d.vocab_size)
            return shared, shared
        return (train_tokenizer(kind, (s for s, _ in inputs.train_examples()), d.vocab_size),
                train_tokenizer(kind, (t for _, t in inputs.train_examples()), d.vocab_size))

    def encode_examples(self, pairs, tokenizers, writer, ctx):
        """Source: ids + <eos>; target: <bos> + ids + <eos>; each side cut to max_len."""
        s_tok, t_tok = tokenizers
        limit = self.config.model.max_len - 1
        sources, targets = [], []
        src_ids = s_tok.encode_arrays([s for s, _ in pairs])
        tgt_ids = t_tok.encode_arrays([t for _, t in pairs])
        for s, t in zip(src_ids, tgt_ids, strict=True):
            ctx["truncated"] += (len(s) > limit) + (len(t) > limit)
            sources.append(np.concatenate([s[:limit], [s_tok.eos_id]]))
            targets.append(np.concatenate([[t_tok.bos_id], t[:limit], [t_tok.eos_id]]))
        writer.add_sequences("src", sources)
        writer.add_sequences("tgt", targets)

    # --- training ------------------------------------------------------------------------
    def model_fields(self, data):
        source, target = data.source_tokenizer, data.target_tokenizer
        if target.pad_id != source.pad_id:
            raise ValueError(f"the source and target tokenizers pad with different ids "
                             f"({source.pad_id}, {target.pad_id}); the model has one pad_id")
        fields = {"vocab_size": source.vocab_size, "pad_id": source.pad_id}
        if target is not source:
            fields["tgt_vocab_size"] = target.vocab_size
        return fields

    def batches(self, data, rank, world):
        return BucketBatches(data.train, data.valid,
                             lengths=lambda split: np.maximum(split.lengths("src"),
                                                              split.lengths("tgt")),
                             collate=self.collate, max_tokens=self.config.data.max_tokens,
                             seed=self.config.train.seed, rank=rank, world=world)

    def collate(self, pairs: list) -> Batch:
        """Padded sources and targets; the targets predicted are every target token after
        <bos>."""
        m, max_len = self.config.data.pad_to_multiple, self.config.model.max_len
        src = pad([s for s, _ in pairs], self.pad_id, multiple=m, cap=max_len)
        return Batch({"src": src, "tgt": pad([t for _, t in pairs], self.pad_id, multiple=m,
                                             plus=1, cap=max_len + 1)},
                     targets=sum(len(t) - 1 for _, t in pairs),
                     tokens=sum(len(s) + len(t) for s, t in pairs),
                     unpadded=frozenset({"src"} if all(len(s) == src.size(1) for s, _ in pairs)
                                        else ()))

    def loss(self, model, batch, smoothing):
        tgt = batch["tgt"]
        # teacher forcing: read tgt[:-1] and predict tgt[1:]. The targets' padding comes after
        # their real tokens, which causal attention never shows a real one: no target mask
        # (tgt_mask=True); none for the sources either where they hold no padding. SDPA's
        # flash kernels take no explicit mask.
        logits = model(batch["src"], tgt[:, :-1], tgt_mask=True,
                       src_mask=True if "src" in batch.unpadded else None)
        return self.criterion(logits.flatten(0, 1), tgt[:, 1:].flatten(),
                              smoothing=smoothing, pad_id=self.pad_id)

    @torch.no_grad()
    def metric(self, model, data, batches, n_examples, device):
        """Exact match, sacreBLEU and chrF of the greedy translations of the first
        ``n_examples`` validation pairs, decoded as ``vaswani translate`` decodes: on the
        inference engine (engine/), each within the run's ``max_len_a`` and ``max_len_b``."""
        pairs = data.raw_valid[:n_examples]
        if not pairs:
            return {}
        target, d = data.target_tokenizer, self.config.decode
        # 64 rows (a small cache); no CUDA graphs captured for a one-off pass; prefill steps
        # of the default 1,024 tokens, with which the runs' validation figures were made
        engine = Engine(model, bos_id=target.bos_id, eos_id=target.eos_id,
                        config=EngineConfig.offline(64, cuda_graphs=False,
                                                    max_step_tokens=1024))
        greedy = Params(max_new_tokens=d.max_new_tokens)  # no decoding rules
        requests = [Request.translation(data.valid[i][0].tolist(), greedy, bos_id=target.bos_id,
                                        max_len_a=d.max_len_a, max_len_b=d.max_len_b)
                    for i in range(len(pairs))]
        engine.run(requests, longest_first=True)  # as `vaswani translate` does
        hyps = [target.decode(r.output) for r in requests]
        refs = [t for _, t in pairs]
        scores = bleu_chrf(hyps, refs)
        return {"exact_match": exact_match(hyps, refs), "bleu": scores["bleu"],
                "chrf": scores["chrf"]}
