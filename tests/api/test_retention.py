"""prompt_cache_retention through the API: a chat asked with "24h" by the official client keeps its
prefix in the disk tier through a device flush and disk pressure that takes an unretained prompt's
blocks; the next request finds it cached; /v1/cache/stats and /metrics count what is retained and
what the budget dropped. Without a persistent tier, "24h" is a 400 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch

from api.cli import build_parser, tier_config
from api.config import ApiConfig
from engine.kv.admin import CheckIntegrity
from storage.codec import encode_block
from storage.config import TierConfig
from tests.api.servers import BLOCK_SIZE, Server, engine_config, fresh_text, metric, start_server

# the tiny llama's encoded block: [layers, 2, block_size, kv heads, head_dim], float32
BLOCK_BYTES = len(encode_block(torch.zeros(2, 2, BLOCK_SIZE, 2, 16)))
DISK_BLOCKS = 24
RETAINED_BLOCKS = 10


@pytest.fixture(scope="module")
def retaining_server(
    tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    tiers = TierConfig(
        disk_path=tmp_path_factory.mktemp("kv"),
        disk_bytes=DISK_BLOCKS * BLOCK_BYTES,
        retained_bytes=RETAINED_BLOCKS * BLOCK_BYTES,
    )
    handle = start_server(engine_config(tiny_llama, num_blocks=64, tiers=tiers), ApiConfig())
    yield handle
    handle.stop()


def settle(server: Server) -> None:
    """Waits until the tier writes queued so far are done."""
    assert server.engine.engine.kv.tiers.store.wait_idle(30)


def retention(client: httpx.Client) -> dict:
    return client.get("/v1/cache/stats").json()["retention"]


def test_a_retained_chat_prefix_comes_back_after_a_flush_and_disk_pressure(
    retaining_server: Server,
) -> None:
    server = retaining_server
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    messages = [
        {"role": "system", "content": fresh_text(6 * BLOCK_SIZE, 5100)},
        {"role": "user", "content": "What did I say?"},
    ]

    def chat(**kw: object):
        return oai.chat.completions.create(
            model=server.model, messages=messages, max_tokens=4, temperature=0, **kw
        )

    first = chat(prompt_cache_retention="24h")  # a keyword of the client's own
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    prefix = first.usage.prompt_tokens // BLOCK_SIZE * BLOCK_SIZE
    plain = fresh_text(6 * BLOCK_SIZE + 2, 5101)
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        body = {"model": server.model, "max_tokens": 2, "temperature": 0}
        assert client.post("/v1/completions", json={**body, "prompt": plain}).status_code == 200
        settle(server)
        kept = retention(client)
        assert kept["tier"] == "disk" and kept["retained_blocks"] == prefix // BLOCK_SIZE
        assert kept["budget_bytes"] == RETAINED_BLOCKS * BLOCK_BYTES
        # pressure: more distinct prompts than the disk holds go through it
        for i in range(6):
            prompt = fresh_text(6 * BLOCK_SIZE + 2, 5200 + i)
            assert (
                client.post("/v1/completions", json={**body, "prompt": prompt}).status_code == 200
            )
            assert client.post("/v1/cache/flush").status_code == 200
        settle(server)
        stats = client.get("/v1/cache/stats").json()
        assert stats["since_start"]["evictions_by_tier"]["disk"] > 0
        found = client.post("/v1/cache/lookup", json={"prompt": plain}).json()
        assert found["cached_tokens"] == 0  # the unretained prompt did not survive

        again = chat()
        assert again.usage.prompt_tokens_details.cached_tokens == prefix
        assert again.choices[0].message.content == first.choices[0].message.content
        hits = client.get("/v1/cache/stats").json()["since_start"]["hit_tokens_by_tier"]
        assert hits["disk"] >= prefix
        text = client.get("/metrics").text
        assert (
            metric(text, "radixcache_cache_retained_blocks", 'tier="disk"') == prefix / BLOCK_SIZE
        )
        assert metric(text, "radixcache_cache_retained_budget_bytes", 'tier="disk"') > 0
    server.engine.admin(CheckIntegrity())


def test_past_the_budget_the_oldest_retained_blocks_are_dropped_and_counted(
    retaining_server: Server,
) -> None:
    server = retaining_server
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        before = retention(client)
        body = {"model": server.model, "max_tokens": 1, "prompt_cache_retention": "24h"}
        for i in range(2):  # 2 x 7 blocks: more than the budget's 10
            prompt = fresh_text(7 * BLOCK_SIZE + 3, 5300 + i)
            assert (
                client.post("/v1/completions", json={**body, "prompt": prompt}).status_code == 200
            )
        settle(server)
        after = retention(client)
        assert after["retained_blocks"] == RETAINED_BLOCKS
        assert after["retained_bytes"] <= after["budget_bytes"]
        assert after["dropped_blocks"] - before["dropped_blocks"] == before["retained_blocks"] + 4
        assert after["granted_blocks"] - before["granted_blocks"] == 14
        text = client.get("/metrics").text
        dropped = metric(text, "radixcache_cache_retention_dropped_blocks_total", 'tier="disk"')
        assert dropped == after["dropped_blocks"]


def test_24h_without_a_persistent_tier_is_refused_in_memory_is_served(
    http: httpx.Client, server: Server
) -> None:
    """(The 400 on both routes: tests/api/test_prompt_cache_key.py.)"""
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(
            model=server.model, messages=messages, max_tokens=1, prompt_cache_retention="24h"
        )
    assert refused.value.body["param"] == "prompt_cache_retention"
    assert "persistent" in refused.value.body["message"]
    reply = oai.chat.completions.create(
        model=server.model, messages=messages, max_tokens=1, prompt_cache_retention="in_memory"
    )
    assert reply.usage.completion_tokens == 1
    assert http.get("/v1/cache/stats").json()["retention"] is None


def test_the_retained_bytes_option_sets_the_budget(tmp_path: Path) -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--disk-path", str(tmp_path), "--retained-bytes", "256M"])
    assert tier_config(args).retained_bytes == 256 << 20
    default = tier_config(parser.parse_args(["serve", "--disk-path", str(tmp_path)]))
    assert default.retained_bytes == 1 << 30
    assert tier_config(parser.parse_args(["serve", "--no-disk"])) is None  # nothing to retain in
