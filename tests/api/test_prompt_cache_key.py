"""prompt_cache_key on chat and completions: accepted (bounded, a string), never isolating (two keys
share a cached prefix), counted per key in /v1/cache/stats and /metrics, with a bounded number of
keys and each tenant's keys shown to that tenant (and the admin) only."""

from __future__ import annotations

import httpx
import openai
import pytest

from api.auth import Caller
from api.observability.prompt_cache_keys import PromptCacheKeys
from tests.api.servers import ADMIN_KEY, BLOCK_SIZE, Server, fresh_text, metric


def client_of(server: Server, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def key_stats(server: Server, headers: dict[str, str] | None = None) -> dict:
    r = httpx.get(f"{server.url}/v1/cache/stats", headers=headers or {}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["prompt_cache_keys"]


def test_openai_client_sends_the_key_and_the_stats_count_its_cached_tokens(server) -> None:
    client = client_of(server)
    messages = [{"role": "system", "content": fresh_text(5 * BLOCK_SIZE, 4200)}]
    messages.append({"role": "user", "content": "Where is my order?"})
    usages = []
    for _ in range(2):
        reply = client.chat.completions.create(
            model=server.model,
            messages=messages,
            max_tokens=4,
            temperature=0,
            prompt_cache_key="customer-42",  # a keyword of the client's own
        )
        usages.append(reply.usage)
    assert usages[0].prompt_tokens_details.cached_tokens == 0
    assert usages[1].prompt_tokens_details.cached_tokens >= 4 * BLOCK_SIZE
    row = key_stats(server)["keys"]["customer-42"]
    assert row["requests"] == 2 and row["tenant"] is None
    assert row["prompt_tokens"] == sum(u.prompt_tokens for u in usages)
    assert row["cached_tokens"] == usages[1].prompt_tokens_details.cached_tokens
    assert row["hit_rate"] == round(row["cached_tokens"] / row["prompt_tokens"], 6)


def test_keys_do_not_isolate_two_keys_share_one_cached_prefix(server) -> None:
    client = client_of(server)
    prompt = fresh_text(6 * BLOCK_SIZE, 4201)
    usages = {}
    for key in ("tenant-a-thread-1", "tenant-a-thread-2"):
        out = client.completions.create(
            model=server.model,
            prompt=prompt,
            max_tokens=3,
            extra_body={"prompt_cache_key": key},  # completions.create has no such keyword
        )
        usages[key] = out.usage
    assert usages["tenant-a-thread-2"].prompt_tokens_details.cached_tokens >= 5 * BLOCK_SIZE
    keys = key_stats(server)["keys"]
    assert keys["tenant-a-thread-1"]["cached_tokens"] == 0
    assert keys["tenant-a-thread-2"]["cached_tokens"] >= 5 * BLOCK_SIZE
    assert keys["tenant-a-thread-2"]["requests"] == 1


def test_a_streamed_request_and_a_batch_are_counted_once_each(server) -> None:
    client = client_of(server)
    prompt = fresh_text(3 * BLOCK_SIZE, 4202)
    chunks = list(
        client.completions.create(
            model=server.model,
            prompt=prompt,
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"prompt_cache_key": "streamed"},
        )
    )
    streamed = chunks[-1].usage
    batch = client.completions.create(
        model=server.model,
        prompt=[prompt, prompt + " and more"],
        max_tokens=2,
        extra_body={"prompt_cache_key": "batched"},
    )
    keys = key_stats(server)["keys"]
    assert keys["streamed"]["requests"] == 1
    assert keys["streamed"]["prompt_tokens"] == streamed.prompt_tokens
    assert keys["batched"]["requests"] == 1  # one HTTP request, two prompts
    assert keys["batched"]["prompt_tokens"] == batch.usage.prompt_tokens
    assert keys["batched"]["cached_tokens"] == batch.usage.prompt_tokens_details.cached_tokens > 0


def test_the_metrics_count_tracked_keys_without_a_label_per_key(http, server) -> None:
    body = {"model": server.model, "prompt": "hi", "max_tokens": 1, "prompt_cache_key": "m-1"}
    assert http.post("/v1/completions", json=body).status_code == 200
    text = http.get("/metrics").text
    assert metric(text, "radixcache_prompt_cache_keys_tracked") >= 1
    assert metric(text, "radixcache_prompt_cache_keys_folded_total") >= 0
    assert "m-1" not in text


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"prompt_cache_key": 42}, "string"),
        ({"prompt_cache_key": ["a"]}, "string"),
        ({"prompt_cache_key": "k" * 257}, "256"),
        ({"prompt_cache_retention": "24h"}, "persistent KV cache tier"),  # this server has none
        ({"prompt_cache_retention": "1h"}, "'in_memory' or '24h'"),
    ],
)
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_bad_keys_and_retention_are_400s_naming_the_field(
    http, server, route: str, fields: dict, message: str
) -> None:
    if route == "/v1/completions":
        body = {"model": server.model, "prompt": "hi", "max_tokens": 1}
    else:
        body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}]}
    r = http.post(route, json={**body, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    (name,) = fields
    assert error["param"] == name and message in error["message"]
    assert error["type"] == "invalid_request_error"


def test_the_longest_key_allowed_is_accepted(http, server) -> None:
    longest = "k" * 256
    body = {"model": server.model, "prompt": "hi", "max_tokens": 1, "prompt_cache_key": longest}
    assert http.post("/v1/completions", json=body).status_code == 200
    assert key_stats(server)["keys"][longest]["requests"] == 1


def test_tenants_see_their_own_keys_and_the_admin_sees_all(auth_server) -> None:
    prompt = fresh_text(2 * BLOCK_SIZE, 4203)
    cached = []
    for api_key in ("sk-alice", "sk-bob", "sk-bob"):
        out = client_of(auth_server, api_key).completions.create(
            model=auth_server.model,
            prompt=prompt,
            max_tokens=1,
            extra_body={"prompt_cache_key": "thread-1"},
        )
        cached.append(out.usage.prompt_tokens_details.cached_tokens)
    # one key, two tenants: their namespaces still isolate (bob's first request hit nothing)
    assert cached[1] == 0 and cached[2] > 0
    alice = key_stats(auth_server, {"Authorization": "Bearer sk-alice"})
    bob = key_stats(auth_server, {"Authorization": "Bearer sk-bob"})
    admin = key_stats(auth_server, {"Authorization": f"Bearer {ADMIN_KEY}"})
    assert alice["keys"]["thread-1"]["requests"] == 1
    assert alice["keys"]["thread-1"]["tenant"] == "alice"
    assert bob["keys"]["thread-1"]["requests"] == 2
    assert bob["keys"]["thread-1"]["cached_tokens"] == cached[2]
    assert not any(label.startswith("tenant:") for label in {**alice["keys"], **bob["keys"]})
    assert admin["keys"]["tenant:alice|thread-1"]["requests"] == 1
    assert admin["keys"]["tenant:bob|thread-1"]["requests"] == 2


def test_the_least_recently_used_key_is_folded_into_its_scopes_other_counts() -> None:
    keys = PromptCacheKeys(max_keys=2)
    alice, bob = Caller("alice", False), Caller("bob", False)
    admin = Caller(None, True)
    keys.record(alice, "a1", 100, 50)
    keys.record(bob, "b1", 10, 0)
    keys.record(alice, "a1", 100, 100)  # a1 is now the most recently used
    keys.record(alice, "a2", 40, 0)  # over the bound: b1 goes
    assert keys.tracked == 2 and keys.folded == 1
    mine = keys.view(alice).report()
    assert list(mine["keys"]) == ["a1", "a2"]  # busiest first
    assert mine["keys"]["a1"] == {
        "requests": 2,
        "prompt_tokens": 200,
        "cached_tokens": 150,
        "hit_rate": 0.75,
        "tenant": "alice",
    }
    assert mine["folded_keys"] == 0 and mine["other"]["requests"] == 0
    theirs = keys.view(bob).report()
    assert theirs["keys"] == {} and theirs["folded_keys"] == 1
    assert theirs["other"] == {
        "requests": 1,
        "prompt_tokens": 10,
        "cached_tokens": 0,
        "hit_rate": 0,
    }
    everyone = keys.view(admin).report()
    assert set(everyone["keys"]) == {"tenant:alice|a1", "tenant:alice|a2"}
    assert everyone["folded_keys"] == 1 and everyone["max_keys"] == 2
    for i in range(100):  # many keys: the bound holds
        keys.record(bob, f"k{i}", 1, 0)
    assert keys.tracked == 2 and keys.folded == 101
