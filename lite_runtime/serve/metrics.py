"""The server's Prometheus metrics (prometheus-client), in a registry of their own. The latency histograms
count each choice of a request (n of them) as one generation; `lite_requests` counts requests."""
from __future__ import annotations

from typing import Optional


class Metrics:
    def __init__(self):
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
        r = CollectorRegistry()
        latency = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
        self.ttft = Histogram("lite_time_to_first_token_seconds", "Time from arrival to a choice's first token",
                              buckets=latency, registry=r)
        self.inter_token = Histogram("lite_inter_token_latency_seconds", "Time between a choice's tokens",
                                     buckets=latency, registry=r)
        self.e2e = Histogram("lite_e2e_request_latency_seconds", "Time from arrival to a choice's end (its last "
                             "token, or its cancellation)", buckets=latency, registry=r)
        self.queue_time = Histogram("lite_request_queue_time_seconds", "Time a request waited for a cache row",
                                    buckets=latency, registry=r)
        self.running = Gauge("lite_requests_running", "Requests holding a cache row", registry=r)
        self.waiting = Gauge("lite_requests_waiting", "Requests waiting for a cache row", registry=r)
        self.cache_rows = Gauge("lite_cache_rows", "Cache rows of the engine (the graph's batch)", registry=r)
        self.prompt_tokens = Counter("lite_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("lite_generation_tokens", "Tokens generated", registry=r)
        self.requests = Counter("lite_requests", "Finished requests by the finish reason of their first choice "
                                "(cancelled: the client went away; abort: the server stopped first)",
                                ["finish_reason"], registry=r)
        self.prefix_hits = Counter("lite_prefix_cache_hits", "Admitted prompts that reused a cached prefix", registry=r)
        self.prefix_tokens = Counter("lite_prefix_cache_tokens", "Prompt tokens whose K/V came from the prefix cache",
                                     registry=r)
        self.prefix_evictions = Gauge("lite_prefix_cache_evictions", "Prompts dropped from the prefix cache so far",
                                      registry=r)
        self.prefix_bytes = Gauge("lite_prefix_cache_bytes", "Bytes the prefix cache holds", registry=r)
        self.guessed = Counter("lite_speculative_proposed_tokens", "Guessed tokens fed to verification steps "
                               "(--speculative)", registry=r)
        self.confirmed = Counter("lite_speculative_accepted_tokens", "Guessed tokens the sampler confirmed",
                                 registry=r)
        self.acceptance = Gauge("lite_speculative_acceptance_rate", "Accepted / proposed guessed tokens so far",
                                registry=r)
        self.kv_usage = Gauge("lite_kv_cache_usage_ratio", "Blocks of the paged KV store held (by rows and cached "
                              "prefixes, each once) over its blocks", registry=r)
        self.kv_bytes = Gauge("lite_kv_cache_used_bytes", "Bytes of the paged KV store's held blocks", registry=r)
        self.kv_capacity = Gauge("lite_kv_cache_capacity_bytes", "Bytes of the paged KV store (kv_cache_gb)",
                                 registry=r)
        self.preemptions = Counter("lite_preemptions", "Running requests preempted for KV blocks (fed again later)",
                                   registry=r)
        self.registry, self.content_type = r, CONTENT_TYPE_LATEST

    def kv_cache(self, held: int, total: int, block_bytes: int, preempted: int) -> None:
        self.kv_usage.set(held / max(total, 1))
        self.kv_bytes.set(held * block_bytes)
        self.kv_capacity.set(total * block_bytes)
        if preempted:
            self.preemptions.inc(preempted)

    def prefix_cache(self, cached: int, cache) -> None:
        if cached:
            self.prefix_hits.inc()
            self.prefix_tokens.inc(cached)
        self.prefix_evictions.set(cache.evictions)
        self.prefix_bytes.set(cache.bytes)

    def speculation(self, proposed: int, accepted: int, rate: float) -> None:
        self.guessed.inc(proposed)
        self.confirmed.inc(accepted)
        self.acceptance.set(rate)

    def token(self, start: float, last: Optional[float], now: float) -> None:
        self.generation_tokens.inc()
        if last is None:
            self.ttft.observe(now - start)
        else:
            self.inter_token.observe(now - last)

    def choice_finished(self, start: float, now: float) -> None:
        """Called once per choice, as `token` is: when it ends, or when its request is cancelled (`runs`)."""
        self.e2e.observe(now - start)

    def request_finished(self, reason: str) -> None:
        """Called once per request: when its last choice ends, or when it is cancelled (`runs`)."""
        self.requests.labels(finish_reason=reason.split(":")[0]).inc()

    def render(self) -> bytes:
        from prometheus_client import generate_latest
        return generate_latest(self.registry)
