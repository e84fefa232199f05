"""`radixcache route` in front of real replicas for /v1/responses and /v1/messages, with the
official clients: a conversation's turns (whole and streamed), GET and DELETE follow the replica
that holds it while round-robin would alternate; a router that never saw an id (restarted) finds
the replica that holds it; replicas sharing a Redis store answer for each other's ids; Anthropic's client works through
the router, its key forwarded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from api.config import ApiConfig
from api.router.config import RouterConfig
from api.router.replicas import ReplicaSpec
from storage.config import TierConfig
from tests.api.router_peers import RouterHandle, start_router
from tests.api.servers import API_KEYS, Server, engine_config, fresh_text, start_server
from tests.redis_server import RedisServer

HEADER = "x-radixcache-replica"
KEY = next(iter(API_KEYS))


@pytest.fixture(scope="module")
def replicas(keyed_replicas: list[Server]) -> list[Server]:
    return keyed_replicas


def router_over(replicas: list[Server], tiny_llama: Path) -> RouterHandle:
    specs = tuple(ReplicaSpec(s.url) for s in replicas)
    api = ApiConfig(api_keys=dict(API_KEYS))
    return start_router(RouterConfig(specs, tiny_llama, policy="round-robin", api=api))


@pytest.fixture(scope="module")
def router(replicas: list[Server], tiny_llama: Path) -> Iterator[RouterHandle]:
    handle = router_over(replicas, tiny_llama)
    yield handle
    handle.stop()


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)


def turn(client: openai.OpenAI, model: str, text: str, previous: str | None) -> Any:
    return client.responses.with_raw_response.create(
        model=model,
        input=text,
        previous_response_id=previous,
        max_output_tokens=4,
        temperature=0,
    )


def test_a_conversation_stays_on_its_replica(router: RouterHandle, replicas: list[Server]) -> None:
    client, model = client_of(router.url), replicas[0].model
    for conversation in range(2):
        raw = turn(client, model, fresh_text(60, seed=conversation), None)
        response, home = raw.parse(), raw.headers[HEADER]
        for n in range(3):  # round-robin alone would alternate
            if n == 1:  # one turn streamed: the router learns its id from response.created
                with client.responses.stream(
                    model=model,
                    input=fresh_text(10, seed=50 + n),
                    previous_response_id=response.id,
                    max_output_tokens=4,
                    temperature=0,
                ) as stream:
                    ends = ("response.completed", "response.incomplete")  # 4 tokens: incomplete
                    response = next(e.response for e in stream if e.type in ends)
                assert router.state.conversations.home(response.id) == home
            else:
                raw = turn(client, model, fresh_text(10, seed=50 + n), response.id)
                response = raw.parse()
                assert raw.headers[HEADER] == home
            assert response.usage.input_tokens_details.cached_tokens > 0
        got = client.responses.with_raw_response.retrieve(response.id)
        assert got.headers[HEADER] == home and got.parse().id == response.id
        client.responses.delete(response.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(response.id)
    assert router.state.stats()["decisions"]["conversation"] >= 2 * 5


def test_a_router_that_never_saw_the_id_finds_its_replica(
    router: RouterHandle, replicas: list[Server], tiny_llama: Path
) -> None:
    first = turn(client_of(router.url), replicas[0].model, fresh_text(40, seed=7), None)
    rid, home = first.parse().id, first.headers[HEADER]
    fresh = router_over(replicas, tiny_llama)  # as after a restart: it knows no id
    try:
        client = client_of(fresh.url)
        got = client.responses.with_raw_response.retrieve(rid)
        assert got.headers[HEADER] == home
        nxt = turn(client, replicas[0].model, "and then?", rid)
        assert nxt.headers[HEADER] == home and nxt.parse().previous_response_id == rid
        with pytest.raises(openai.NotFoundError):  # the replicas' own answer, after both
            client.responses.retrieve("resp_nobody")
    finally:
        fresh.stop()


def test_anthropics_client_through_the_router(router: RouterHandle, replicas: list[Server]) -> None:
    client = anthropic.Anthropic(base_url=router.url, api_key=KEY, max_retries=0, timeout=120)
    raw = client.messages.with_raw_response.create(
        model=replicas[0].model,
        max_tokens=4,
        system=fresh_text(60, seed=11),
        messages=[{"role": "user", "content": "hello"}],
    )
    assert raw.headers[HEADER] in ("r0", "r1") and raw.parse().type == "message"
    with client.messages.stream(
        model=replicas[0].model,
        max_tokens=4,
        messages=[{"role": "user", "content": "hello again"}],
    ) as stream:
        assert stream.get_final_message().usage.output_tokens > 0
    bad = anthropic.Anthropic(base_url=router.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        bad.messages.create(model=replicas[0].model, max_tokens=4, messages=[])
    assert err.value.body["type"] == "error"  # the router's refusal, in Anthropic's shape


def test_replicas_sharing_a_redis_store_answer_for_each_other(
    redis_server: RedisServer, tiny_llama: Path
) -> None:
    """Both replicas served with the same --redis-url keep their responses there: a router with
    --shared-response-store that never saw an id sends it where its policy says (round-robin:
    the other replica than the one that made it), asking no second replica."""
    tiers = TierConfig(redis_url=redis_server.url)
    api = ApiConfig(api_keys=dict(API_KEYS))
    pair = [start_server(engine_config(tiny_llama, tiers=tiers), api) for _ in range(2)]
    try:
        first = turn(client_of(pair[0].url), pair[0].model, fresh_text(40, seed=21), None)
        rid = first.parse().id
        specs = tuple(ReplicaSpec(s.url) for s in pair)
        config = RouterConfig(
            specs, tiny_llama, policy="round-robin", api=api, shared_response_store=True
        )
        handle = start_router(config)
        try:
            client = client_of(handle.url)
            answers = [client.responses.with_raw_response.retrieve(rid) for _ in range(2)]
            assert [a.headers[HEADER] for a in answers] == ["r0", "r1"]
            assert {a.parse().id for a in answers} == {rid}
            nxt = turn(client, pair[0].model, "and then?", rid)
            assert nxt.parse().previous_response_id == rid
            assert "id_search" not in handle.state.stats()["decisions"]
        finally:
            handle.stop()
    finally:
        for s in pair:
            s.stop()


def test_a_messages_users_turns_stay_on_one_replica(
    replicas: list[Server], tiny_llama: Path
) -> None:
    """Anthropic's metadata.user_id is the Messages route's affinity key (it has no
    prompt_cache_key): unrelated prompts spread over the replicas, one user's stay together."""
    specs = tuple(ReplicaSpec(s.url) for s in replicas)
    api = ApiConfig(api_keys=dict(API_KEYS))
    handle = start_router(RouterConfig(specs, tiny_llama, api=api))  # cache-aware
    client = anthropic.Anthropic(base_url=handle.url, api_key=KEY, max_retries=0, timeout=120)

    def home(seed: int, user: str | None) -> str:
        extra = {} if user is None else {"metadata": {"user_id": user}}
        return client.messages.with_raw_response.create(
            model=replicas[0].model,
            max_tokens=2,
            system=fresh_text(40, seed=seed),  # no cached prefix to follow
            messages=[{"role": "user", "content": "hi"}],
            **extra,
        ).headers[HEADER]

    try:
        assert {home(500 + i, None) for i in range(4)} == {"r0", "r1"}
        assert len({home(510 + i, "ada") for i in range(4)}) == 1
        stats = handle.state.stats()  # (the stats route wants a key)
        assert stats["decisions"]["key_affinity"] == 3 and stats["key_affinity"]["keys"] == 1
    finally:
        handle.stop()
