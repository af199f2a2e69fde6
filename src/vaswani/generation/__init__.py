"""Turning a trained model into outputs: greedy, beam search and sampling, with a KV cache."""

from .decode import Sampling, beam_decode, generate, generate_batch, greedy_decode
from .rules import Rules
from .search import beam_search, decode_loop, length_penalty, sample_next
from .steppers import LMStepper, Seq2SeqStepper

__all__ = ["LMStepper", "Rules", "Sampling", "Seq2SeqStepper", "beam_decode", "beam_search",
           "decode_loop", "generate", "generate_batch", "greedy_decode", "length_penalty",
           "sample_next"]
