"""Prometheus metrics: a registry per app; engine counters are read at scrape time, latencies are
observed by the API as tokens reach the client. Names: ours (`radixcache_*`, the default) or, for
what we share with vLLM, vLLM's (metrics_vllm.py), so dashboards made for vLLM read us."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.config import METRIC_NAMES
from api.observability import metrics_vllm
from api.observability.engine_stats import EngineCounters, RetentionCounters, TierTraffic
from api.observability.latency import LatencyRecorder
from api.observability.pools import layer_types_report
from engine.speculative.stats import SpecStats
from radixcache.stats import CacheStats

if TYPE_CHECKING:
    from api.observability.prompt_cache_keys import PromptCacheKeys

PREFIX = "radixcache"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class EngineCollector(Collector):
    """Exports the engine's own counters (kept in plain fields there) when Prometheus scrapes."""

    def __init__(
        self,
        read: Callable[[], EngineCounters],
        tokens_per_s: Callable[[], float],
        shared: bool = True,
    ) -> None:
        self._read = read
        self._tokens_per_s = tokens_per_s
        self._shared = shared  # False: what vLLM also reports is left to the vLLM collector

    def collect(self) -> Iterator[Metric]:
        c = self._read()
        if self._shared:
            yield from self._shared_metrics(c)
        yield from self._own_metrics(c)

    def _shared_metrics(self, c: EngineCounters) -> Iterator[Metric]:
        cache = c.cache
        yield _counter("prefix_cache_queries_tokens", "Prompt tokens looked up", cache.query_tokens)
        yield _counter("prefix_cache_hits_tokens", "Prompt tokens found cached", cache.hit_tokens)
        yield _counter("prefill_tokens", "Prompt tokens computed (not cached)", c.prefill_tokens)
        yield _gauge("num_requests_running", "Requests being run", c.running)
        yield _gauge("num_requests_waiting", "Requests waiting for a slot", c.waiting)
        yield from _spec_metrics(c.spec)

    def _own_metrics(self, c: EngineCounters) -> Iterator[Metric]:
        cache = c.cache
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
        if c.device.windows is not None:
            yield from _layer_type_metrics(c.device)
        yield from _redis_nodes(c.redis_nodes)
        if c.retention is not None:
            yield from _retention_metrics(c.retention)
        if c.tier_traffic is not None:
            yield from _tier_traffic_metrics(c.tier_traffic)


def _retention_metrics(r: RetentionCounters) -> Iterator[Metric]:
    """prompt_cache_retention: what the persistent tier keeps, and how retentions ended."""
    gauge, counter = GaugeMetricFamily, CounterMetricFamily
    yield _by_tier(gauge, "cache_retained_blocks", "Blocks retained", r.tier, r.retained_blocks)
    yield _by_tier(gauge, "cache_retained_bytes", "Bytes retained", r.tier, r.retained_bytes)
    yield _by_tier(
        gauge, "cache_retained_budget_bytes", "Budget of retained bytes", r.tier, r.budget_bytes
    )
    yield _by_tier(
        counter,
        "cache_retention_dropped_blocks",
        "Retentions ended early past the budget (oldest first)",
        r.tier,
        r.dropped_blocks,
    )
    yield _by_tier(
        counter,
        "cache_retention_expired_blocks",
        "Retentions that ran their full time",
        r.tier,
        r.expired_blocks,
    )


def _tier_traffic_metrics(t: TierTraffic) -> Iterator[Metric]:
    """Loads from and writes to the spill tiers; a load past its deadline or failing is
    recomputed, so these say what the tiers did not save."""
    rows = [
        ("cache_tier_loads", "Loads that asked the spill tiers", t.loads),
        ("cache_tier_loaded_blocks", "Blocks loaded from the spill tiers", t.loaded_blocks),
        (
            "cache_tier_load_deadline_misses",
            "Loads taken before done (the rest recomputed)",
            t.load_deadline_misses,
        ),
        ("cache_tier_load_errors", "Loads cut short by a tier failure", t.load_errors),
        ("cache_tier_stored_blocks", "Blocks handed to the tier writer", t.stored_blocks),
        ("cache_tier_dropped_writes", "Blocks not written: writer queue full", t.dropped_writes),
    ]
    for name, doc, value in rows:
        yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)
    yield GaugeMetricFamily(
        f"{PREFIX}_cache_tier_pending_writes", "Blocks queued for the tiers", value=t.pending_writes
    )


def _by_tier(family: type, name: str, doc: str, tier: str, value: float) -> Metric:
    metric = family(f"{PREFIX}_{name}", doc, labels=["tier"])
    metric.add_metric([tier], value)
    return metric


def _layer_type_metrics(device: CacheStats) -> Iterator[Metric]:
    """A hybrid cache's pools per layer type (full_attention, sliding_window)."""
    report = layer_types_report(device)
    blocks = GaugeMetricFamily(
        f"{PREFIX}_cache_layer_type_blocks",
        "Device KV blocks per layer type and state",
        labels=["layer_type", "state"],
    )
    hits = CounterMetricFamily(
        f"{PREFIX}_prefix_cache_layer_type_hits_tokens",
        "Prompt tokens the layers of a type found cached",
        labels=["layer_type"],
    )
    for layer_type, pool in report.items():
        for state in ("free", "evictable", "referenced", "cached"):
            blocks.add_metric([layer_type, state], pool[state])
        hits.add_metric([layer_type], pool["hit_tokens"])
    yield blocks
    yield hits


def _spec_metrics(s: SpecStats) -> Iterator[Metric]:
    yield _counter("spec_decode_num_drafts", "Speculative drafts verified", s.num_drafts)
    yield _counter("spec_decode_num_draft_tokens", "Draft tokens verified", s.num_draft_tokens)
    yield _counter(
        "spec_decode_num_accepted_tokens", "Draft tokens accepted", s.num_accepted_tokens
    )
    per_pos = CounterMetricFamily(
        f"{PREFIX}_spec_decode_num_accepted_tokens_per_pos",
        "Draft tokens accepted, by position in the draft",
        labels=["position"],
    )
    for j, n in enumerate(s.accepted_per_pos):
        per_pos.add_metric([str(j)], n)
    yield per_pos
    yield _gauge("spec_decode_acceptance_rate", "Accepted / drafted tokens", s.acceptance_rate)
    yield _gauge(
        "spec_decode_mean_accepted_length",
        "Tokens emitted per verified draft (accepted + 1)",
        s.mean_accepted_length,
    )


def _redis_nodes(nodes: dict[str, dict[str, int]]) -> Iterator[Metric]:
    """Per Redis node (a cluster master, or the one server): up, errors, writes dropped."""
    up = GaugeMetricFamily(
        f"{PREFIX}_redis_node_up", "1 while a Redis node serves, 0 after a failure", labels=["node"]
    )
    errors = CounterMetricFamily(
        f"{PREFIX}_redis_node_errors", "Failed calls to a Redis node", labels=["node"]
    )
    dropped = CounterMetricFamily(
        f"{PREFIX}_redis_node_rejected_writes_blocks",
        "Blocks not written to a Redis node (down or failing)",
        labels=["node"],
    )
    for node, h in sorted(nodes.items()):
        up.add_metric([node], h["up"])
        errors.add_metric([node], h["errors"])
        dropped.add_metric([node], h["rejected_writes"])
    yield from (up, errors, dropped)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


class KVEventsCollector(Collector):
    """The KV-events publisher's counters (engine.kv.events.PublisherStats), read at scrape time."""

    def __init__(self, read: Callable[[], Any]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        s = self._read()
        yield _counter("kv_events_offered", "KV cache events handed to the publisher", s.offered)
        yield _counter(
            "kv_events_dropped", "KV cache events dropped (publisher queue full)", s.dropped
        )
        yield _counter("kv_events_batches", "KV event batches published", s.batches)
        yield _counter("kv_events_replays", "KV event replay requests served", s.replays)


class PromptCacheKeysCollector(Collector):
    """How many prompt_cache_keys are counted apart, and how many were folded away (no label per
    key: clients choose keys, so their number is unbounded)."""

    def __init__(self, keys: PromptCacheKeys) -> None:
        self._keys = keys

    def collect(self) -> Iterator[Metric]:
        yield _gauge(
            "prompt_cache_keys_tracked", "prompt_cache_keys counted apart", self._keys.tracked
        )
        yield _counter(
            "prompt_cache_keys_folded",
            "prompt_cache_keys folded into their scope's other counts (least recently used)",
            self._keys.folded,
        )


class _WithoutCreated(Collector):
    """The registry's metrics less the `_created` series (per registry: prometheus_client's own
    switch is process-wide)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class ApiMetrics:
    """The app's registry (never the process-global one, so several apps can live in a process).

    `names`: "radixcache" (ours) or "vllm" (what vLLM also reports under vLLM's names)."""

    def __init__(self, names: str = "radixcache", model_name: str = "") -> None:
        if names not in METRIC_NAMES:
            raise ValueError(f"metric names {names!r}: expected one of {METRIC_NAMES}")
        self.names = names
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self._view = _WithoutCreated(self.registry)
        self.ttft_recorder = LatencyRecorder()  # fine buckets for the history's quantiles
        self.ttft = self._histogram(
            "time_to_first_token_seconds", metrics_vllm.TTFT, "Time to first token", TTFT_BUCKETS
        )
        self.itl = self._histogram(
            "inter_token_latency_seconds",
            metrics_vllm.ITL,
            "Time between output tokens",
            ITL_BUCKETS,
        )
        self.e2e = self._histogram(
            "request_latency_seconds",
            metrics_vllm.E2E,
            "Request latency, arrival to last token",
            TTFT_BUCKETS,
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
            registry=self.registry if names == "radixcache" else None,
        )
        self.rejected = Counter(
            f"{PREFIX}_rejected_requests",
            "Requests refused because the queue was full",
            registry=self.registry,
        )

    def _histogram(self, ours: str, vllm: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        if self.names == "vllm":
            family = Histogram(
                vllm, doc, labelnames=metrics_vllm.LABELS, buckets=buckets, registry=self.registry
            )
            return family.labels(*metrics_vllm.label_values(self.model_name))
        return Histogram(f"{PREFIX}_{ours}", doc, buckets=buckets, registry=self.registry)

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)
        self.ttft_recorder.observe(seconds)

    def count_output(self, n: int) -> None:
        self.output_tokens += n
        self.output_counter.inc(n)

    def watch_engine(
        self, read: Callable[[], EngineCounters], tokens_per_s: Callable[[], float]
    ) -> None:
        vllm = self.names == "vllm"
        self.registry.register(EngineCollector(read, tokens_per_s, shared=not vllm))
        if vllm:
            self.registry.register(metrics_vllm.VllmCollector(read, self.model_name))

    def watch_prompt_cache_keys(self, keys: PromptCacheKeys) -> None:
        self.registry.register(PromptCacheKeysCollector(keys))

    def watch_kv_events(self, read: Callable[[], Any]) -> None:
        self.registry.register(KVEventsCollector(read))

    def render(self) -> bytes:
        return generate_latest(self._view)
