"""``GET /metrics``: the server's state in Prometheus' text format (prometheus-client), per
model (label ``model``):

    vaswani_requests_waiting, vaswani_requests_running     requests queued / being decoded
    vaswani_cache_slots_used, vaswani_cache_slots, vaswani_cache_slot_width   the engine's
                                                           key/value cache
    vaswani_generated_tokens_total                         tokens made (rate() gives tokens/s)
    vaswani_requests_total                                 requests taken
    vaswani_spec_decode_draft_tokens_total,                tokens guessed, and those that
    vaswani_spec_decode_accepted_tokens_total              held (--speculate; as vLLM's
    vaswani_spec_decode_drafts_total                       spec_decode metrics), in passes
    vaswani_prefill_tokens_total                           prompt tokens prefill passes computed
    vaswani_prefix_cache_queries_total,                    prompt tokens looked up among the
    vaswani_prefix_cache_hits_total                        kept prefixes, and found there (as
                                                           vLLM's prefix_cache metrics)
    vaswani_prefix_cache_bytes                             memory the kept prefixes hold
    vaswani_time_to_first_token_seconds                    histogram, from arrival
    vaswani_time_per_output_token_seconds                  histogram, after the first token

Gauges and counters are read from the engines when scraped; the two histograms are observed as
each request finishes. Every app has a registry of its own (several in one process do not
collide).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..engine import Request

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics(Collector):
    def __init__(self, server) -> None:
        self.server = server
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.first_token = Histogram(
            "vaswani_time_to_first_token_seconds", "Seconds from a request's arrival to its "
            "first token", ["model"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.per_token = Histogram(
            "vaswani_time_per_output_token_seconds", "Seconds per token after the first, "
            "each request's mean", ["model"], buckets=LATENCY_BUCKETS, registry=self.registry)

    def finished(self, name: str, request: Request) -> None:
        """Observe a request's latencies (from the engines' thread)."""
        if request.first_token is None or request.finished is None:
            return
        self.first_token.labels(name).observe(request.first_token - request.arrived)
        if request.generated > 1:
            self.per_token.labels(name).observe(
                (request.finished - request.first_token) / (request.generated - 1))

    def collect(self):
        families = {
            "waiting": GaugeMetricFamily("vaswani_requests_waiting", "Requests queued",
                                         labels=["model"]),
            "running": GaugeMetricFamily("vaswani_requests_running", "Requests being decoded",
                                         labels=["model"]),
            "slots_used": GaugeMetricFamily("vaswani_cache_slots_used", "Key/value cache "
                                            "slots (rows) in use", labels=["model"]),
            "slots": GaugeMetricFamily("vaswani_cache_slots", "Key/value cache slots at "
                                       "their present width", labels=["model"]),
            "slot_width": GaugeMetricFamily("vaswani_cache_slot_width", "Tokens a key/value "
                                            "cache slot holds", labels=["model"]),
            "tokens_out": CounterMetricFamily("vaswani_generated_tokens", "Tokens generated",
                                              labels=["model"]),
            "requests": CounterMetricFamily("vaswani_requests", "Requests taken",
                                            labels=["model"]),
            "guessed": CounterMetricFamily("vaswani_spec_decode_draft_tokens", "Tokens "
                                           "guessed (speculative decoding)", labels=["model"]),
            "accepted": CounterMetricFamily("vaswani_spec_decode_accepted_tokens", "Guessed "
                                            "tokens that held", labels=["model"]),
            "guess_passes": CounterMetricFamily("vaswani_spec_decode_drafts", "Forward passes "
                                                "that checked guesses", labels=["model"]),
            "prefilled_tokens": CounterMetricFamily(
                "vaswani_prefill_tokens", "Prompt tokens computed by prefill passes (a "
                "prompt's last token may be fed by a decoding step)", labels=["model"]),
            "prefix_queried_tokens": CounterMetricFamily(
                "vaswani_prefix_cache_queries", "Prompt tokens looked up among the kept "
                "prefixes", labels=["model"]),
            "prefix_hit_tokens": CounterMetricFamily(
                "vaswani_prefix_cache_hits", "Prompt tokens found among the kept prefixes "
                "(not computed again)", labels=["model"]),
            "prefix_cache_bytes": GaugeMetricFamily("vaswani_prefix_cache_bytes", "Memory the "
                                                    "kept prefixes hold", labels=["model"]),
        }
        for name in self.server.runs:
            served = self.server.served(name)
            for key, family in families.items():
                if key in served:
                    family.add_metric([name], served[key])
        yield from families.values()

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
