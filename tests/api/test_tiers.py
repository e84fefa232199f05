"""Spill tiers seen through the API: lookups, cached_tokens, stats and metrics per tier."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.config import ApiConfig
from engine.kv.admin import CheckIntegrity
from storage.config import TierConfig
from tests.api.servers import BLOCK_SIZE, Server, engine_config, fresh_text, metric, start_server

HOST_BYTES = 16 << 20


@pytest.fixture(scope="module")
def tier_server(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tiers = TierConfig(host_bytes=HOST_BYTES, disk_path=tmp_path_factory.mktemp("kv"))
    # the learned policy evicts unread tails one block at a time: the tiers must take those too
    cfg = engine_config(tiny_llama, num_blocks=64, tiers=tiers, eviction_policy="learned")
    handle = start_server(cfg, ApiConfig())
    yield handle
    handle.stop()


def wait_for_tier(client: httpx.Client, prompt: str, tier: str, timeout_s: float = 30.0) -> dict:
    """Polls /v1/cache/lookup until `tier` holds part of the prompt (spills are asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = client.post("/v1/cache/lookup", json={"prompt": prompt}).json()
        if found["cached_tokens_by_tier"].get(tier, 0) > 0:
            return found
        time.sleep(0.02)  # polling interval
    raise AssertionError(f"no blocks of the prompt reached the {tier} tier: {found}")


def test_flushed_prefix_comes_back_from_host_tier(tier_server: Server) -> None:
    server = tier_server
    prompt = fresh_text(6 * BLOCK_SIZE + 2, 60)
    body = {"model": server.model, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        first = client.post("/v1/completions", json=body).json()
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert client.post("/v1/cache/flush").json()["flushed_blocks"] >= 6
        found = wait_for_tier(client, prompt, "host")
        assert found["cached_tokens_by_tier"]["device"] == 0
        assert found["cached_tokens"] >= 6 * BLOCK_SIZE
        again = client.post("/v1/completions", json=body).json()
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 6 * BLOCK_SIZE
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        stats = client.get("/v1/cache/stats").json()
        assert stats["device"]["policy"] == "learned"
        assert stats["since_start"]["hit_tokens_by_tier"]["host"] >= 6 * BLOCK_SIZE
        host = stats["occupancy"]["host"]
        assert host["used_bytes"] > 0 and host["capacity_bytes"] == HOST_BYTES
        assert "disk" in stats["occupancy"]
        traffic = stats["tier_traffic"]  # the load that brought the prefix back, and the spill
        assert traffic["loads"] >= 1 and traffic["loaded_blocks"] >= 6
        assert traffic["stored_blocks"] >= 6 and traffic["load_errors"] == 0
        text = client.get("/metrics").text
        assert metric(text, "radixcache_cache_tier_loaded_blocks_total") >= 6
        assert metric(text, "radixcache_cache_tier_load_deadline_misses_total") >= 0
        assert metric(text, "radixcache_prefix_cache_tier_hits_tokens_total", 'tier="host"') > 0
        assert metric(text, "radixcache_cache_used_bytes", 'tier="host"') > 0
    server.engine.admin(CheckIntegrity())
