"""Cache analytics endpoints and Prometheus metrics move as requests run."""

from __future__ import annotations

import httpx

from engine.kv.admin import CheckIntegrity
from tests.api.servers import BLOCK_SIZE, Server, fresh_text, metric


def complete(http: httpx.Client, server: Server, prompt: str, **kw) -> dict:
    body = {"model": server.model, "prompt": prompt, "max_tokens": 4, "temperature": 0, **kw}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_metrics_counters_move(http, server) -> None:
    before = http.get("/metrics").text
    prompt = fresh_text(6 * BLOCK_SIZE, 20)
    complete(http, server, prompt)
    complete(http, server, prompt)
    after = http.get("/metrics").text
    for name in (
        "radixcache_prefix_cache_queries_tokens_total",
        "radixcache_prefix_cache_hits_tokens_total",
        "radixcache_generation_tokens_total",
        "radixcache_time_to_first_token_seconds_count",
        "radixcache_inter_token_latency_seconds_count",
    ):
        assert metric(after, name) > metric(before, name), name
    hit_delta = metric(after, "radixcache_prefix_cache_hits_tokens_total") - metric(
        before, "radixcache_prefix_cache_hits_tokens_total"
    )
    assert hit_delta >= 5 * BLOCK_SIZE
    tier = 'tier="device"'
    assert metric(after, "radixcache_prefix_cache_tier_hits_tokens_total", tier) >= hit_delta
    assert metric(after, "radixcache_num_requests_running") == 0
    assert "radixcache_cache_evictions_blocks_total" in after


def test_stats_hit_rates_and_occupancy(http, server) -> None:
    before = http.get("/v1/cache/stats").json()
    prompt = fresh_text(4 * BLOCK_SIZE + 1, 21)
    for _ in range(3):
        complete(http, server, prompt)
    stats = http.get("/v1/cache/stats", params={"window_minutes": 1}).json()
    start, window = stats["since_start"], stats["window"]
    assert start["hit_tokens"] - before["since_start"]["hit_tokens"] >= 2 * 4 * BLOCK_SIZE
    assert 0 < start["hit_rate"] <= 1 and 0 < window["hit_rate"] <= 1
    assert window["minutes"] == 1 and window["hit_tokens"] <= start["hit_tokens"]
    assert start["hit_rate_by_tier"]["device"] > 0
    assert start["compute_saved_flops"] > 0
    assert stats["occupancy"]["device"]["capacity_blocks"] == server.engine.engine.kv.num_blocks
    dev = stats["device"]
    assert dev["free"] + dev["evictable"] + dev["referenced"] + dev["pinned"] == dev["num_blocks"]
    assert any(ns["hit_tokens"] > 0 for ns in stats["namespaces"])


def test_integrity_counts_blocks_under_the_stats_names(http, server) -> None:
    complete(http, server, fresh_text(3 * BLOCK_SIZE, 23))
    report = http.get("/v1/cache/integrity").json()
    device = http.get("/v1/cache/stats").json()["device"]
    assert report["ok"] and report["error"] is None
    blocks = report["blocks"]  # idle: nothing moves between the two reads
    assert blocks == {name: device[name] for name in blocks}
    assert set(blocks) >= {"num_blocks", "free", "evictable", "referenced", "pinned", "cached"}
    assert blocks["num_blocks"] == device["num_blocks"] > 0


def test_lookup_reports_cached_prefix_without_running(http, server) -> None:
    prompt = fresh_text(3 * BLOCK_SIZE + 5, 22)
    r = http.post("/v1/cache/lookup", json={"prompt": prompt})
    assert r.json()["cached_tokens"] == 0 and r.json()["prompt_tokens"] == 3 * BLOCK_SIZE + 5
    complete(http, server, prompt)
    after = http.post("/v1/cache/lookup", json={"prompt": prompt}).json()
    assert after["cached_tokens"] >= 3 * BLOCK_SIZE
    assert after["cached_tokens_by_tier"]["device"] == after["cached_tokens"]
    messages = [{"role": "user", "content": prompt}]
    chat = http.post("/v1/cache/lookup", json={"messages": messages}).json()
    assert chat["prompt_tokens"] > after["prompt_tokens"]
    assert http.post("/v1/cache/lookup", json={}).status_code == 400
    bad_model = {"prompt": "x", "model": "nope"}
    assert http.post("/v1/cache/lookup", json=bad_model).status_code == 404


def test_prefixes_show_hot_prefix_with_preview(http, server) -> None:
    prompt = "The hottest prefix of all: " + fresh_text(4 * BLOCK_SIZE, 23)
    for _ in range(4):
        complete(http, server, prompt)
    rows = http.get("/v1/cache/prefixes", params={"limit": 50}).json()["data"]
    mine = [r for r in rows if r["preview"].startswith("The hottest prefix of all")]
    assert mine and mine[0]["hits"] >= 3 and mine[0]["tokens_saved"] > 0
    assert mine[0]["num_tokens"] >= 4 * BLOCK_SIZE and mine[0]["last_used"]


def test_pin_survives_flush_then_unpin(http, server) -> None:
    prompt = fresh_text(4 * BLOCK_SIZE, 24)
    complete(http, server, prompt)
    pinned = http.post("/v1/cache/pin", json={"prompt": prompt}).json()
    assert pinned["pinned_tokens"] >= 3 * BLOCK_SIZE
    flushed = http.post("/v1/cache/flush", json={}).json()
    assert flushed["flushed_blocks"] >= 0
    assert http.post("/v1/cache/lookup", json={"prompt": prompt}).json()["cached_tokens"] > 0
    unpinned = http.post("/v1/cache/unpin", json={"prompt": prompt}).json()
    assert unpinned["unpinned_tokens"] == pinned["pinned_tokens"]
    http.post("/v1/cache/flush")
    assert http.post("/v1/cache/lookup", json={"prompt": prompt}).json()["cached_tokens"] == 0
    server.engine.admin(CheckIntegrity())


def test_flush_one_namespace(http, server) -> None:
    prompt = fresh_text(3 * BLOCK_SIZE, 25)
    complete(http, server, prompt, cache_salt="keep")
    complete(http, server, prompt, cache_salt="drop")
    http.post("/v1/cache/flush", json={"cache_salt": "drop"})
    keep = http.post("/v1/cache/lookup", json={"prompt": prompt, "cache_salt": "keep"}).json()
    drop = http.post("/v1/cache/lookup", json={"prompt": prompt, "cache_salt": "drop"}).json()
    assert keep["cached_tokens"] > 0 and drop["cached_tokens"] == 0
