"""Turning a trained model into outputs: greedy, beam search and sampling, with a KV cache."""

from .decode import beam_decode, generate, greedy_decode, sample_decode
from .search import beam_search, decode_loop, length_penalty, sample_next
from .steppers import LMStepper, Seq2SeqStepper

__all__ = ["LMStepper", "Seq2SeqStepper", "beam_decode", "beam_search", "decode_loop",
           "generate", "greedy_decode", "length_penalty", "sample_decode", "sample_next"]
