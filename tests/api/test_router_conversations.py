"""The router's /v1/responses and /v1/messages in front of real replicas (a conversation staying
on its replica, a restarted router, a shared Redis store: test_router_responses.py): an id the
router does not know is searched for replica by replica, unless the replicas share a store; the
caller's key and Anthropic headers reach the replica; the router's own errors come in each
protocol's shape, with no replica, and when a replica dies mid-stream. And the parts: the id
map, the stream scanner, the lenient reading of bodies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.config import ApiConfig
from api.router.config import RouterConfig
from api.router.conversations import StreamIdScanner, response_homes, response_id_of_body
from api.router.lenient import messages_prompt, responses_prompt
from api.router.proxy import Usage, forward_headers
from api.router.replicas import ReplicaSpec
from api.router.tokenize import PromptTokenizer
from radixcache.shared.chat_template import ChatPrompt
from tests.api.router_peers import RouterHandle, spawn_replica, start_router
from tests.api.servers import (
    API_KEYS,
    ENGINE_SETTINGS,
    Server,
    fresh_text,
)
from tests.ports import free_port

HEADER = "x-radixcache-replica"
KEY = next(iter(API_KEYS))
AUTH = {"authorization": f"Bearer {KEY}"}
ANTHROPIC = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}


# --- the parts ---
def test_the_id_map_is_bounded_and_forgets_a_replica() -> None:
    homes = response_homes(max_ids=2)
    homes.learn("resp_a", "r0")
    homes.learn("resp_b", "r1")
    assert homes.home("resp_a") == "r0"  # a lookup makes it the most recent
    homes.learn("resp_c", "r1")
    assert homes.home("resp_b") is None and homes.counts.evicted == 1
    homes.forget_replica("r1")
    assert homes.home("resp_c") is None and homes.home("resp_a") == "r0"
    homes.forget("resp_a")
    assert homes.stats() == {
        "ids": 0,
        "max_ids": 2,
        "learned": 3,
        "moved": 0,
        "evicted": 1,
        "forgotten": 2,
    }


def test_the_id_is_read_from_a_whole_response_or_a_streams_first_event() -> None:
    assert response_id_of_body(b'{"id": "resp_1", "object": "response"}') == "resp_1"
    assert response_id_of_body(b'{"id": "chatcmpl-1", "object": "chat.completion"}') is None
    assert response_id_of_body(b"not json") is None
    event = b'event: response.created\r\ndata: {"type": "response.created", "response": '
    event += b'{"id": "resp_9", "object": "response"}}\r\n\r\nevent: response.in_progress\n'
    scanner = StreamIdScanner()
    assert [scanner.feed(event[i : i + 7]) for i in range(0, 70, 7)] == [None] * 10
    assert scanner.feed(event[70:]) == "resp_9" and scanner.feed(b"data: {}\n\n") is None
    silent = StreamIdScanner()
    assert silent.feed(b"data: [DONE]\n\n") is None and silent.done


def test_usage_is_read_in_every_protocols_shape() -> None:
    chat, responses, messages = Usage(), Usage(), Usage()
    chat.scan(b'"usage":{"prompt_tokens":30,"prompt_tokens_details":{"cached_tokens":16}}')
    responses.scan(b'"usage":{"input_tokens":30,"input_tokens_details":{"cached_tokens":16}}')
    messages.scan(b'"usage":{"input_tokens":14,"cache_read_input_tokens":16}')
    assert (chat.prompt_tokens, chat.cached_tokens) == (30, 16)
    assert (responses.prompt_tokens, responses.cached_tokens) == (30, 16)
    assert (messages.prompt_tokens, messages.cached_tokens) == (30, 16)


def test_forwarded_headers_are_the_keys_and_the_protocols_own() -> None:
    incoming = {
        "authorization": "Bearer sk-a",
        "x-api-key": "sk-b",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "prompt-caching-2024-07-31",
        "content-type": "application/json",
        "cookie": "session=1",
        "host": "router:8000",
        "content-length": "12",
    }
    assert set(forward_headers(incoming)) == set(incoming) - {"cookie", "host", "content-length"}


def test_bodies_are_read_as_the_chat_a_replica_renders(tiny_llama: Path) -> None:
    tok = PromptTokenizer(tiny_llama)
    tool = {"name": "get_weather", "description": "weather", "parameters": {"type": "object"}}
    chat = ChatPrompt(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi there"},
            {"role": "user", "content": "weather?"},
        ],
        [{"type": "function", "function": tool}],
    )
    responses = {
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": "hello"},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "hi there"}
            ]},
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        ],
        "tools": [{"type": "function", **tool}],
    }  # fmt: skip
    messages = {
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi there"}]},
            {"role": "user", "content": "weather?"},
        ],
        "tools": [{"name": "get_weather", "description": "weather", "input_schema": {
            "type": "object"
        }}],
    }  # fmt: skip
    assert tok.render(responses_prompt(responses)) == tok.render(chat)
    assert tok.render(messages_prompt(messages)) == tok.render(chat)
    assert responses_prompt({"input": 7}) is None  # not understood: routed on no prompt
    assert messages_prompt({"messages": [{"role": "user"}]}) is None


# --- the router in front of real replicas ---
@pytest.fixture(scope="module")
def replicas(keyed_replicas: list[Server]) -> list[Server]:
    return keyed_replicas


def router_over(
    urls: list[str],
    tokenizer: Path,
    keys: bool = True,
    replicas_up: bool = True,
    **settings: Any,
) -> RouterHandle:
    specs = tuple(ReplicaSpec(u) for u in urls)
    api = ApiConfig(api_keys=dict(API_KEYS)) if keys else ApiConfig()
    config = RouterConfig(specs, tokenizer, policy="round-robin", api=api, **settings)
    return start_router(config, replicas_up=replicas_up)


def _asked(handle: RouterHandle) -> dict[str, tuple[int, dict]]:
    """Per replica: the requests the router sent it, by the reason it chose it."""
    replicas = handle.state.stats()["replicas"]
    return {name: (r["requests"], r["decisions"]) for name, r in replicas.items()}


def test_an_id_the_router_does_not_know_is_searched_for_replica_by_replica(
    replicas: list[Server], tiny_llama: Path
) -> None:
    body = {"model": replicas[1].model, "input": fresh_text(20, seed=3), "max_output_tokens": 2}
    with httpx.Client(timeout=60, headers=AUTH) as http:
        held = http.post(f"{replicas[1].url}/v1/responses", json=body).json()["id"]
    handle = router_over([s.url for s in replicas], tiny_llama)  # it has not seen `held`
    try:
        with httpx.Client(base_url=handle.url, timeout=60, headers=AUTH) as http:
            got = http.get(f"/v1/responses/{held}")
            assert got.status_code == 200 and got.headers[HEADER] == "r1"
            assert got.json()["id"] == held
            # r0 (least loaded, first) was asked first; only its 404 sent the router on to r1
            search = {"id_search": 1}
            assert _asked(handle) == {"r0": (1, search), "r1": (1, search)}
            turn = http.post("/v1/responses", json={**body, "previous_response_id": held})
            assert turn.status_code == 200 and turn.headers[HEADER] == "r1"
            assert _asked(handle) == {"r0": (1, search), "r1": (2, {**search, "conversation": 1})}
            nobody = http.get("/v1/responses/resp_nobody")
            assert nobody.status_code == 404 and "resp_nobody" in nobody.json()["error"]["message"]
            unknown = http.post(
                "/v1/responses", json={**body, "previous_response_id": "resp_nobody"}
            )
            assert unknown.status_code == 400  # the replicas' own answer, after asking both
            assert unknown.json()["error"]["code"] == "previous_response_not_found"
            assert handle.state.stats()["decisions"]["id_search"] == 6  # each replica asked
            assert handle.state.conversations.home("resp_nobody") is None
    finally:
        handle.stop()


def test_with_a_shared_store_an_unknown_id_goes_to_one_replica(
    replicas: list[Server], tiny_llama: Path
) -> None:
    handle = router_over([s.url for s in replicas], tiny_llama, shared_response_store=True)
    try:
        with httpx.Client(base_url=handle.url, timeout=60, headers=AUTH) as http:
            missing = http.get("/v1/responses/resp_elsewhere")
            assert missing.status_code == 404  # one replica's 404, passed back as it is
            asked = _asked(handle)
            assert sum(n for n, _ in asked.values()) == 1, asked
            stats = handle.state.stats()
            assert "id_search" not in stats["decisions"]
            assert stats["response_ids"]["shared_store"] is True
    finally:
        handle.stop()


def test_the_callers_headers_reach_the_replica_and_errors_keep_each_protocols_shape(
    replicas: list[Server], tiny_llama: Path
) -> None:
    """The replica requires a key and anthropic-version (the router checks neither's presence
    for it): its 200 proves the router forwarded both; its refusals of a missing version or an
    unknown beta, passed back, prove those headers reach it too."""
    handle = router_over([replicas[0].url], tiny_llama)
    model = replicas[0].model
    body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    try:
        with httpx.Client(base_url=handle.url, timeout=60) as http:
            ok = http.post("/v1/messages", json=body, headers=ANTHROPIC)
            assert ok.status_code == 200 and ok.json()["type"] == "message"
            versionless = http.post("/v1/messages", json=body, headers={"x-api-key": KEY})
            assert versionless.status_code == 400
            assert "anthropic-version" in versionless.json()["error"]["message"]
            beta = {**ANTHROPIC, "anthropic-beta": "no-such-beta-2099-01-01"}
            unserved = http.post("/v1/messages", json=body, headers=beta)
            assert unserved.status_code == 400
            assert "no-such-beta-2099-01-01" in unserved.json()["error"]["message"]
            chat = {
                "model": model,
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}],
            }
            assert http.post("/v1/chat/completions", json=chat, headers=AUTH).status_code == 200
            # the router's own refusals: Anthropic's shape on /v1/messages ...
            denied = http.post("/v1/messages", json=body, headers={**ANTHROPIC, "x-api-key": "no"})
            assert denied.status_code == 401
            assert denied.json()["type"] == "error"
            assert denied.json()["error"]["type"] == "authentication_error"
            bad = http.post("/v1/messages", content=b"{nope", headers=ANTHROPIC)
            assert bad.status_code == 400
            assert bad.json()["error"]["type"] == "invalid_request_error"
            # ... OpenAI's on /v1/responses
            bad = http.post("/v1/responses", content=b"[1]", headers=AUTH)
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
        assert _asked(handle)["r0"][0] == 4  # the refusals above never reached the replica
    finally:
        handle.stop()


def test_no_replica_is_a_503_in_each_protocols_shape(tiny_llama: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    handle = router_over([nowhere], tiny_llama, keys=False, replicas_up=False)
    try:
        body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(base_url=handle.url, timeout=30) as http:
            messages = http.post("/v1/messages", json=body)
            assert messages.status_code == 503
            assert messages.json() == {
                "type": "error",
                "error": {
                    "type": "overloaded_error",
                    "message": "No replica could take the request",
                },
            }
            responses = http.post("/v1/responses", json={"input": "hi"})
            assert responses.status_code == 503
            assert responses.json()["error"]["code"] == "no_replica"
        assert handle.state.stats()["unrouted"] == 2
    finally:
        handle.stop()


def test_a_stream_cut_mid_way_ends_with_the_protocols_error_event(tiny_llama: Path) -> None:
    """A replica process killed once each stream's first event has come through: each stream
    ends with its protocol's error event, never hangs."""
    long = {**ENGINE_SETTINGS, "max_model_len": 1024}  # the tiny model's own bound
    doomed = spawn_replica(tiny_llama, long)
    try:
        handle = router_over([doomed.url], tiny_llama, keys=False)
        try:
            model = httpx.get(f"{doomed.url}/v1/models", timeout=30).json()["data"][0]["id"]
            _cut_both_streams(handle, model, doomed.kill)
            assert handle.state.stats()["replicas"]["r0"]["failures"] == 2
        finally:
            handle.stop()
    finally:
        doomed.kill()  # also when the router never started: no replica outlives the test


def _cut_both_streams(handle: RouterHandle, model: str, kill: Any) -> None:
    text = fresh_text(20, seed=11)  # greedy on the tiny model: no end of text in 960 tokens
    responses_body = {
        "model": model,
        "input": text,
        "stream": True,
        "max_output_tokens": 960,
        "temperature": 0,
    }
    messages_body = {
        "model": model,
        "max_tokens": 960,
        "temperature": 0,
        "stream": True,
        "messages": [{"role": "user", "content": text}],
    }
    anthropic = {"anthropic-version": "2023-06-01"}
    with (
        httpx.Client(base_url=handle.url, timeout=60) as http,
        http.stream("POST", "/v1/responses", json=responses_body) as responses,
        http.stream("POST", "/v1/messages", json=messages_body, headers=anthropic) as messages,
    ):
        for resp in (responses, messages):
            assert resp.status_code == 200, resp.read()
        streams = [(responses, *_first_event(responses)), (messages, *_first_event(messages))]
        kill()
        texts = [seen + "".join(chunks) for _, chunks, seen in streams]
    *_, last = texts[0].strip().split("\n\n")
    assert last.startswith("event: error\ndata: ")
    assert json.loads(last.split("data: ", 1)[1])["code"] == "replica_failed"
    assert "response.completed" not in texts[0] and "response.incomplete" not in texts[0]
    *_, last = texts[1].strip().split("\n\n")
    error = json.loads(last.split("data: ", 1)[1])
    assert last.startswith("event: error\n") and error["error"]["type"] == "api_error"
    assert "message_stop" not in texts[1]


def _first_event(resp: httpx.Response) -> tuple[Iterator[str], str]:
    """Reads a stream until its first whole event; the iterator goes on from there."""
    chunks = resp.iter_text()
    seen = ""
    while "\n\n" not in seen.replace("\r\n", "\n"):
        seen += next(chunks)
    return chunks, seen
