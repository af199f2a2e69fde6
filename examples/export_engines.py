"""Tutorial: export a translator and run it in CTranslate2 and ONNX Runtime, without vaswani
(docs/tutorials/export.md).

    python examples/export_engines.py runs/copy "abcdefghij" "jihgfedcba"

Exports RUN_DIR twice (CTranslate2, ONNX), then translates the given sentences with each
engine called directly, as its own users call it, using only the exported folder: the
tokenizer file and the options vaswani wrote there.
"""

import json
import sys
import tomllib
from pathlib import Path

import ctranslate2
import numpy as np
import onnxruntime
from tokenizers import Tokenizer

from vaswani.export import export

run = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/copy")
sentences = sys.argv[2:] or ["abcdefghij", "jihgfedcba"]

# 1. Export: each format is checked against vaswani when it is written.
ct2_dir = export(run, "ct2", Path("exports") / f"{run.name}-ct2", overwrite=True)
onnx_dir = export(run, "onnx", Path("exports") / f"{run.name}-onnx", overwrite=True)
print("wrote", ct2_dir, "and", onnx_dir)


class RunTokenizer:
    """The run's source tokenizer read from its file, without vaswani: a character tokenizer
    is a JSON list of specials then characters (ids in that order); a BPE one is a Hugging
    Face `tokenizers` file."""

    def __init__(self, path: Path):
        saved = json.loads(path.read_text())
        self.chars = saved.get("kind") == "char"
        if self.chars:
            self.vocab = saved["specials"] + saved["chars"]
        else:
            self.bpe = Tokenizer.from_file(str(path))

    def tokens(self, text: str) -> list[str]:
        return list(text) if self.chars else self.bpe.encode(text).tokens

    def ids(self, text: str) -> list[int]:
        return ([self.vocab.index(c) for c in text] if self.chars
                else self.bpe.encode(text).ids)

    def id(self, token: str) -> int:
        return self.vocab.index(token) if self.chars else self.bpe.token_to_id(token)

    def text(self, ids: list[int]) -> str:
        if self.chars:
            return "".join(self.vocab[i] for i in ids if i >= 4)  # 4 specials come first
        return self.bpe.decode(ids)


# The run's tokenizer travels with every export, under vaswani/tokenizer/.
meta = json.loads((ct2_dir / "vaswani" / "tokenizer" / "meta.json").read_text())
tok = RunTokenizer(ct2_dir / "vaswani" / "tokenizer" / meta["source"]["file"])
EOS, BOS = tok.id("<eos>"), tok.id("<bos>")
config = tomllib.loads((ct2_dir / "vaswani" / "config.toml").read_text())
LONGEST = config["model"]["max_len"] - 1  # the model's positions, less the <eos>

# 2. CTranslate2, as its README in the export says: token strings in, one call for all
#    sentences (it sorts and batches them itself), greedy here.
translator = ctranslate2.Translator(str(ct2_dir), device="cpu", inter_threads=1,
                                    intra_threads=2)
results = translator.translate_batch([tok.tokens(s) for s in sentences], beam_size=1,
                                     min_decoding_length=0, max_decoding_length=LONGEST,
                                     suppress_sequences=[["<pad>"], ["<bos>"]])
ct2_out = [tok.text([tok.id(t) for t in r.hypotheses[0]]) for r in results]
print("CTranslate2: ", ct2_out)

# 3. ONNX Runtime: the encoder once, then the teacher-forced decoder once per output token
#    (greedy; the graphs have no cache, so each step reads the whole prefix again).
encoder = onnxruntime.InferenceSession(str(onnx_dir / "encoder.onnx"))
decoder = onnxruntime.InferenceSession(str(onnx_dir / "decoder.onnx"))
onnx_out = []
for sentence in sentences:
    ids = np.array([tok.ids(sentence) + [EOS]], dtype=np.int64)
    mask = np.ones_like(ids, dtype=bool)
    (memory,) = encoder.run(None, {"input_ids": ids, "attention_mask": mask})
    out = [BOS]
    while len(out) < LONGEST:
        (logits,) = decoder.run(None, {"decoder_input_ids": np.array([out], dtype=np.int64),
                                       "memory": memory, "attention_mask": mask})
        best = int(logits[0, -1].argmax())
        if best == EOS:
            break
        out.append(best)
    onnx_out.append(tok.text(out[1:]))
print("ONNX Runtime:", onnx_out)
assert ct2_out == onnx_out, "the two engines should agree on greedy translations"
