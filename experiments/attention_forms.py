"""A compiled translator step's cross-attention written five ways, each compiled by Inductor
as the package's step is (dynamic shapes): whether another form of the attention than the
one the package runs (cpu/attention.py ``one_query_attention``) would make its loops
faster.

    python -m experiments.attention_forms [--rows 512] [--beam 4] [--heads 4] [--head-dim 32]
                                          [--source 40] [--threads 1] [--rounds 5]
                                          [--json OUT.json]

A step of ``--rows`` rows, each one query a head over the keys and values of its source
(``--beam`` rows a source, as a beam search's hypotheses share theirs), sources of up to
``--source`` tokens (their own lengths drawn from half that up), read from a cache of source
slots by index, as the compiled step reads them. The forms:

* ``sums``: the package's own (``one_query_attention``): sums of elementwise products,
  which Inductor fuses with the gather of each row's keys;
* ``sums, division after``: the softmax's division once a row and head, after the sum over
  the values, not for every key inside it;
* ``keys transposed``: ``sums`` over a cache that lays each source's keys out key-minor
  (slots, heads, head dim, keys), so that a row's scores are sums down columns;
* ``grouped by source``: a source's rows as more queries of one row, its keys read once;
* ``matrix products``: the keys and values gathered into tensors of their own and
  multiplied (cpu/attention.py ``decoding_attention``).

Each is checked against the attention in float64 first; then the forms are timed in turn,
``--rounds`` times 50 calls at ``--threads`` threads (one: a worker of ``--workers 2``), the
best call of each and the ratio to ``sums``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

CALLS = 50  # calls a round, each form


def inputs(rows: int, beam: int, heads: int, head_dim: int, source: int, seed: int = 0
           ) -> dict:
    """A step's queries (R, H, 1, Dh), a cache of source slots (as wide as ``source``
    rounded up to 16, as the engine aligns them) and each row's source and its length."""
    g = torch.Generator().manual_seed(seed)
    groups = -(-rows // beam)
    width = -(-source // 16) * 16
    lengths = torch.randint(max(1, source // 2), source + 1, (groups,), generator=g)
    k = torch.randn(groups + 3, heads, width, head_dim, generator=g)
    return {"q": torch.randn(rows, heads, 1, head_dim, generator=g), "k": k,
            "kt": k.transpose(-1, -2).contiguous().transpose(-1, -2),  # key-minor
            "v": torch.randn(groups + 3, heads, width, head_dim, generator=g),
            "sources": torch.arange(rows) // beam,
            "lengths": lengths.repeat_interleave(beam)[:rows],
            "members": torch.arange(groups * beam).clamp(max=rows - 1).view(groups, beam),
            "keys": torch.empty(int(lengths.max()))}


def gathered(x: dict, cache: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each row's source keys, values and its mask (R, 1, 1, X), as the step reads them."""
    X = x["keys"].size(0)
    k = cache.index_select(0, x["sources"])[:, :, :X]
    v = x["v"].index_select(0, x["sources"])[:, :, :X]
    mask = torch.arange(X)[None, None, None, :] < x["lengths"][:, None, None, None]
    return k, v, mask


def sums(x: dict) -> Tensor:
    from vaswani.cpu.attention import one_query_attention
    return one_query_attention(x["q"], *gathered(x, x["k"]))


def sums_division_after(x: dict) -> Tensor:
    k, v, mask = gathered(x, x["k"])
    q = x["q"] * (1.0 / math.sqrt(x["q"].size(-1)))
    scores = (q * k).sum(-1).masked_fill(~mask[:, :, 0], torch.finfo(q.dtype).min)
    e = (scores - scores.amax(-1, keepdim=True)).exp()  # (R, H, X)
    return ((e[..., None] * v).sum(-2) / e.sum(-1)[..., None])[:, :, None]


def keys_transposed(x: dict) -> Tensor:
    from vaswani.cpu.attention import one_query_attention
    return one_query_attention(x["q"], *gathered(x, x["kt"]))


def grouped_by_source(x: dict) -> Tensor:
    members = x["members"]
    G, K = members.shape
    R, H, _, Dh = x["q"].shape
    X = x["keys"].size(0)
    sources = x["sources"].index_select(0, members[:, 0])
    k = x["k"].index_select(0, sources)[:, :, :X]  # (G, H, X, Dh): once a source
    v = x["v"].index_select(0, sources)[:, :, :X]
    q = x["q"].index_select(0, members.view(-1)).view(G, K, H, Dh).transpose(1, 2)
    q = q * (1.0 / math.sqrt(Dh))
    scores = (q[:, :, :, None, :] * k[:, :, None]).sum(-1)  # (G, H, K, X)
    lengths = x["lengths"].index_select(0, members[:, 0])
    allowed = torch.arange(X)[None, None, None, :] < lengths[:, None, None, None]
    weights = scores.masked_fill(~allowed, torch.finfo(q.dtype).min).softmax(-1)
    out = (weights[..., None] * v[:, :, None]).sum(-2)  # (G, H, K, Dh)
    return out.transpose(1, 2).reshape(G * K, H, 1, Dh)[:R]


def matrix_products(x: dict) -> Tensor:
    from vaswani.cpu.attention import decoding_attention
    k, v, mask = gathered(x, x["k"])
    return decoding_attention(x["q"], k.contiguous(), v.contiguous(), mask)


FORMS: dict[str, Callable[[dict], Tensor]] = {
    "sums": sums, "sums, division after": sums_division_after,
    "keys transposed": keys_transposed, "grouped by source": grouped_by_source,
    "matrix products": matrix_products}


def reference(x: dict) -> Tensor:
    """The attention in float64, row by row's source, written out."""
    k, v, mask = gathered({**x, "v": x["v"].double()}, x["k"].double())
    q = x["q"].double() / math.sqrt(x["q"].size(-1))
    scores = (q @ k.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


def compare(x: dict, compiled: dict[str, Callable]) -> dict[str, float]:
    """Each compiled form's largest difference from :func:`reference`; a form that is not
    the attention (beyond float32's rounding) stops the experiment, naming it."""
    want, out = reference(x), {}
    for name, form in compiled.items():
        with torch.inference_mode():
            got = form(x)
        out[name] = (got.double() - want).abs().max().item()
        if not out[name] < 1e-4:
            raise SystemExit(f"the form {name!r} is not the attention: it differs by "
                             f"{out[name]:.3g} from the reference")
    return out


def time_forms(x: dict, compiled: dict[str, Callable], rounds: int) -> dict[str, list[float]]:
    """Seconds a call, each round's mean over :data:`CALLS` calls, the forms in turn."""
    times: dict[str, list[float]] = {name: [] for name in compiled}
    with torch.inference_mode():
        for _ in range(rounds):
            for name, form in compiled.items():
                form(x)
                start = time.perf_counter()
                for _ in range(CALLS):
                    form(x)
                times[name].append((time.perf_counter() - start) / CALLS)
    return times


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--beam", type=int, default=4, help="rows that share a source")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--source", type=int, default=40, help="the longest source's tokens")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args(argv)

    from benchmarks.common import hardware, report

    torch.set_num_threads(args.threads)
    x = inputs(args.rows, args.beam, args.heads, args.head_dim, args.source)
    compiled = {name: torch.compile(form, dynamic=True) for name, form in FORMS.items()}
    differences = compare(x, compiled)  # (each compiled once here, before the timing)
    times = time_forms(x, compiled, args.rounds)
    base = min(times["sums"])
    result = {"shape": {k: getattr(args, k) for k in ("rows", "beam", "heads", "head_dim",
                                                        "source")},
              "threads": args.threads, "rounds": args.rounds, "forms": {
                  name: {"ms": round(min(t) * 1e3, 4),
                         "median_ms": round(statistics.median(t) * 1e3, 4),
                         "sums_over_this": round(base / min(t), 2),
                         "largest_difference": differences[name]}
                  for name, t in times.items()}, "hardware": hardware()}
    report("A compiled step's cross-attention, five forms",
           [(name, f"{one['ms']:.3f} ms a call ({one['sums_over_this']:.2f}x sums), within "
             f"{one['largest_difference']:.2g} of float64")
            for name, one in result["forms"].items()], result, args.json)
    return result


if __name__ == "__main__":
    main()
