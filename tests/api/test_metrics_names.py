"""/metrics names: ours by default, vLLM's (names, types, labels) with --metrics-names vllm;
no `_created` series; the shipped Grafana dashboard reads only metrics we export."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.cli import api_config, build_parser
from api.config import ApiConfig
from api.observability.metrics import ApiMetrics
from tests.api.servers import Server, engine_config, fresh_text, start_server

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "radixcache.json"
SERVED = "served-model"
VLLM_TYPES = {  # what vLLM's PrometheusStatLogger exports for what we share with it
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
}


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def one_value(family, suffix: str = "") -> float:
    values = [s.value for s in family.samples if s.name == family.name + suffix]
    assert len(values) == 1, family
    return values[0]


def run_requests(url: str, model: str, n: int) -> None:
    prompt = fresh_text(48, 500)
    with httpx.Client(base_url=url, timeout=60.0) as client:
        for _ in range(n):  # a miss, then hits
            body = {"model": model, "prompt": prompt, "max_tokens": 3}
            assert client.post("/v1/completions", json=body).status_code == 200


@pytest.fixture(scope="module")
def vllm_server(tiny_llama: Path) -> Iterator[Server]:
    cfg = ApiConfig(metrics_names="vllm", served_model_name=SERVED)
    handle = start_server(engine_config(tiny_llama), cfg)
    yield handle
    handle.stop()


def test_default_names_are_ours_without_created(http, server) -> None:
    run_requests(server.url, server.model, 2)
    text = http.get("/metrics").text
    assert "_created" not in text
    assert "vllm:" not in text
    found = families(text)
    assert found["radixcache_prefix_cache_hits_tokens"].type == "counter"
    assert found["radixcache_time_to_first_token_seconds"].type == "histogram"


def test_vllm_names_types_and_labels(vllm_server: Server) -> None:
    run_requests(vllm_server.url, SERVED, 3)
    text = httpx.get(f"{vllm_server.url}/metrics").text
    assert "_created" not in text
    found = families(text)
    for name, kind in VLLM_TYPES.items():
        assert found[name].type == kind, name
        for sample in found[name].samples:
            assert sample.labels["model_name"] == SERVED and sample.labels["engine"] == "0"
    stats = httpx.get(f"{vllm_server.url}/v1/cache/stats").json()["since_start"]
    assert one_value(found["vllm:prefix_cache_queries"], "_total") == stats["query_tokens"]
    hits = one_value(found["vllm:prefix_cache_hits"], "_total")
    assert hits == stats["hit_tokens"] and hits > 0
    assert one_value(found["vllm:time_to_first_token_seconds"], "_count") == 3
    assert one_value(found["vllm:e2e_request_latency_seconds"], "_count") == 3
    assert one_value(found["vllm:generation_tokens"], "_total") >= 3 * 2
    assert one_value(found["vllm:prompt_tokens"], "_total") >= 3 * 48
    assert 0 <= one_value(found["vllm:kv_cache_usage_perc"]) <= 1
    assert one_value(found["vllm:num_requests_running"]) == 0
    # the shared metrics are not exported twice; ours for the rest stay
    assert "radixcache_prefix_cache_queries_tokens" not in found
    assert "radixcache_time_to_first_token_seconds" not in found
    assert found["radixcache_cache_evictions_blocks"].type == "counter"


def test_cli_flag_selects_the_names() -> None:
    args = build_parser().parse_args(["serve", "--metrics-names", "vllm"])
    assert api_config(args).metrics_names == "vllm"
    assert api_config(build_parser().parse_args(["serve"])).metrics_names == "radixcache"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--metrics-names", "sglang"])
    with pytest.raises(ValueError, match="vllm"):
        ApiMetrics("sglang")


def test_grafana_dashboard_reads_exported_metrics(http) -> None:
    dashboard = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = {n for e in exprs for n in re.findall(r"\b(radixcache_[a-z_]+)", e)}
    assert len(names) >= 10
    parsed = list(text_string_to_metric_families(http.get("/metrics").text))
    # sample names (_total, _bucket ...), and families without samples (spill tiers off here)
    exported = {s.name for f in parsed for s in f.samples} | {f.name for f in parsed}
    assert names <= exported, names - exported
