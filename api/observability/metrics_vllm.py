"""The metrics we share with vLLM under vLLM's names, types and labels (`--metrics-names vllm`),
so a Grafana dashboard made for vLLM reads a radixcache server unchanged."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.observability.engine_stats import EngineCounters
from engine.speculative.stats import SpecStats

LABELS = ["model_name", "engine"]  # vLLM labels every engine metric with both (engine "0": one)
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
E2E = "vllm:e2e_request_latency_seconds"


def label_values(model_name: str) -> list[str]:
    return [model_name, "0"]


class VllmCollector(Collector):
    """Engine counters read at scrape time, as vLLM's PrometheusStatLogger names them."""

    def __init__(self, read: Callable[[], EngineCounters], model_name: str) -> None:
        self._read = read
        self._labels = label_values(model_name)

    def collect(self) -> Iterator[Metric]:
        c = self._read()
        cache, device = c.cache, c.device
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            cache.query_tokens,
        )
        # every tier's hits (vLLM counts its device pool here): the dashboards' hit rate is ours
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            cache.hit_tokens,
        )
        yield self._counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", c.prompt_tokens
        )
        yield self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", c.generation_tokens
        )
        yield self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", c.running
        )
        yield self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", c.waiting
        )
        # vLLM's usage counts blocks held by requests; cached unreferenced blocks count as free
        in_use = device.num_blocks - device.free - device.evictable
        usage = in_use / device.num_blocks if device.num_blocks else 0.0
        yield self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage
        )
        yield from self._spec(c.spec)

    def _spec(self, s: SpecStats) -> Iterator[Metric]:
        yield self._counter(
            "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", s.num_drafts
        )
        yield self._counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", s.num_draft_tokens
        )
        yield self._counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            s.num_accepted_tokens,
        )
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            labels=[*LABELS, "position"],
        )
        for j, n in enumerate(s.accepted_per_pos):
            per_pos.add_metric([*self._labels, str(j)], n)
        yield per_pos

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=LABELS)
        family.add_metric(self._labels, value)
        return family

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=LABELS)
        family.add_metric(self._labels, value)
        return family
