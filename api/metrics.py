"""Prometheus metrics: a registry per app; engine counters are read at scrape time, latencies are
observed by the API as tokens reach the client."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.engine_stats import EngineCounters

PREFIX = "radixcache"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class EngineCollector(Collector):
    """Exports the engine's own counters (kept in plain fields there) when Prometheus scrapes."""

    def __init__(
        self, read: Callable[[], EngineCounters], tokens_per_s: Callable[[], float]
    ) -> None:
        self._read = read
        self._tokens_per_s = tokens_per_s

    def collect(self) -> Iterator[Metric]:
        c = self._read()
        cache = c.cache
        yield _counter("prefix_cache_queries_tokens", "Prompt tokens looked up", cache.query_tokens)
        yield _counter("prefix_cache_hits_tokens", "Prompt tokens found cached", cache.hit_tokens)
        tiers = CounterMetricFamily(
            f"{PREFIX}_prefix_cache_tier_hits_tokens",
            "Cached prompt tokens by tier",
            labels=["tier"],
        )
        for tier, n in sorted(cache.hit_tokens_by_tier.items()):
            tiers.add_metric([tier], n)
        yield tiers
        evictions = CounterMetricFamily(
            f"{PREFIX}_cache_evictions_blocks", "Blocks evicted from a tier", labels=["tier"]
        )
        for tier, n in sorted(cache.evictions_by_tier.items()):
            evictions.add_metric([tier], n)
        yield evictions
        yield _counter("prefill_tokens", "Prompt tokens computed (not cached)", c.prompt_tokens)
        yield _gauge("num_requests_running", "Requests being run", c.running)
        yield _gauge("num_requests_waiting", "Requests waiting for a slot", c.waiting)
        yield _gauge(
            "generation_tokens_per_second", "Output tokens/s (last minute)", self._tokens_per_s()
        )
        used = GaugeMetricFamily(
            f"{PREFIX}_cache_used_blocks", "KV blocks held by a tier", labels=["tier"]
        )
        used_bytes = GaugeMetricFamily(
            f"{PREFIX}_cache_used_bytes", "Bytes held by a spill tier", labels=["tier"]
        )
        for tier, occ in sorted(c.occupancy.items()):
            if occ.used_blocks is not None:
                used.add_metric([tier], occ.used_blocks)
            if occ.used_bytes is not None:
                used_bytes.add_metric([tier], occ.used_bytes)
        yield used
        yield used_bytes


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


class ApiMetrics:
    """The app's registry (never the process-global one, so several apps can live in a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Time to first token",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Time between output tokens",
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            f"{PREFIX}_request_latency_seconds",
            "Request latency, arrival to last token",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            f"{PREFIX}_http_requests",
            "Finished generation requests",
            ["endpoint", "outcome"],
            registry=self.registry,
        )
        self.output_tokens = 0
        self.output_counter = Counter(
            f"{PREFIX}_generation_tokens",
            "Tokens sent to clients",
            registry=self.registry,
        )
        self.rejected = Counter(
            f"{PREFIX}_rejected_requests",
            "Requests refused because the queue was full",
            registry=self.registry,
        )

    def count_output(self, n: int) -> None:
        self.output_tokens += n
        self.output_counter.inc(n)

    def watch_engine(
        self, read: Callable[[], EngineCounters], tokens_per_s: Callable[[], float]
    ) -> None:
        self.registry.register(EngineCollector(read, tokens_per_s))

    def render(self) -> bytes:
        return generate_latest(self.registry)
