"""Turning a trained model into outputs: the reference decoders (greedy, beam search and
sampling, reference.py) that the inference engine (engine/) is tested against, and what both
share: one sentence's beam search (search.py), sampling many rows at once (sampling.py) and
the decoding rules (rules.py)."""

from .reference import (
                        LMStepper,
                        Seq2SeqStepper,
                        beam_decode,
                        beam_search,
                        decode_loop,
                        generate,
                        greedy_decode,
                        sample_next,
)
from .rules import Rules
from .search import Beam, length_penalty

__all__ = ["Beam", "LMStepper", "Rules", "Seq2SeqStepper", "beam_decode", "beam_search",
           "decode_loop", "generate", "greedy_decode", "length_penalty", "sample_next"]
