"""The router's /v1/responses and /v1/messages in front of scripted replicas (tests/api/
scripted_replica.py: each keeps its own responses and records what reached it): a conversation's
turns, GETs and DELETEs follow the replica that answered it; an id the router does not know is
searched for, unless the replicas share a store; the caller's Anthropic headers reach the
replica; the router's own errors come in each protocol's shape. And the parts: the id map, the
stream scanner, the lenient reading of bodies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.config import ApiConfig
from api.router.config import RouterConfig
from api.router.conversations import ResponseHomes, StreamIdScanner, response_id_of_body
from api.router.lenient import messages_prompt, responses_prompt
from api.router.proxy import Usage, forward_headers
from api.router.replicas import ReplicaSpec
from api.router.tokenize import PromptTokenizer
from radixcache.shared.chat_template import ChatPrompt
from tests.api.router_peers import RouterHandle, start_router
from tests.api.scripted_replica import ScriptedReplica

HEADER = "x-radixcache-replica"


# --- the parts ---
def test_the_id_map_is_bounded_and_forgets_a_replica() -> None:
    homes = ResponseHomes(max_ids=2)
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


# --- the router in front of scripted replicas ---
@pytest.fixture(scope="module")
def scripted() -> Iterator[list[ScriptedReplica]]:
    replicas = [ScriptedReplica("a"), ScriptedReplica("b")]
    yield replicas
    for r in replicas:
        r.stop()


def router_over(
    replicas: list[ScriptedReplica], tokenizer: Path, **settings: object
) -> RouterHandle:
    specs = tuple(ReplicaSpec(r.url) for r in replicas)
    return start_router(RouterConfig(specs, tokenizer, policy="round-robin", **settings))


def test_a_conversation_follows_the_replica_that_holds_it(
    scripted: list[ScriptedReplica], tiny_llama: Path
) -> None:
    handle = router_over(scripted, tiny_llama)
    try:
        with httpx.Client(base_url=handle.url, timeout=30) as http:
            firsts = [http.post("/v1/responses", json={"input": f"hi {i}"}) for i in range(2)]
            assert [r.headers[HEADER] for r in firsts] == ["r0", "r1"]  # round-robin
            for first in firsts:
                rid, home = first.json()["id"], first.headers[HEADER]
                for _ in range(3):  # round-robin would alternate: the conversation does not
                    turn = http.post(
                        "/v1/responses",
                        json={"input": "more", "previous_response_id": rid, "stream": True},
                    )
                    assert turn.status_code == 200 and turn.headers[HEADER] == home
                    assert "response.output_text.delta" in turn.text
                    rid = _created_id(turn.text)  # learned from the stream's first event
                got = http.get(f"/v1/responses/{rid}")
                assert got.status_code == 200 and got.headers[HEADER] == home
                gone = http.delete(f"/v1/responses/{rid}")
                assert gone.json()["deleted"] and gone.headers[HEADER] == home
            stats = handle.stats()
            assert stats["decisions"]["conversation"] == 2 * 5
            assert stats["response_ids"]["learned"] == 2 * 4
            assert stats["replicas"]["r0"]["reported_cached_tokens"] == 4 * 4
    finally:
        handle.stop()


def _created_id(stream: str) -> str:
    first = next(line for line in stream.splitlines() if line.startswith("data:"))
    return httpx.Response(200, content=first[5:]).json()["response"]["id"]


def test_an_id_the_router_does_not_know_is_searched_for(
    scripted: list[ScriptedReplica], tiny_llama: Path
) -> None:
    with httpx.Client(timeout=30) as http:
        held = http.post(f"{scripted[1].url}/v1/responses", json={"input": "x"}).json()["id"]
    handle = router_over(scripted, tiny_llama)  # a router that has not seen `held`
    try:
        with httpx.Client(base_url=handle.url, timeout=30) as http:
            before = len(scripted[0].seen)
            got = http.get(f"/v1/responses/{held}")
            assert got.status_code == 200 and got.headers[HEADER] == "r1"
            assert scripted[0].paths()[before:] == [f"GET /v1/responses/{held}"]  # its 404
            turn = http.post("/v1/responses", json={"input": "y", "previous_response_id": held})
            assert turn.headers[HEADER] == "r1" and len(scripted[0].seen) == before + 1
            nobody = http.get("/v1/responses/resp_nobody")
            assert nobody.status_code == 404 and "resp_nobody" in nobody.json()["error"]["message"]
            unknown = http.post(
                "/v1/responses", json={"input": "z", "previous_response_id": "resp_nobody"}
            )
            assert unknown.status_code == 404  # the replicas' answer, after asking both
            assert handle.stats()["decisions"]["id_search"] == 6  # each replica asked counts
    finally:
        handle.stop()


def test_with_a_shared_store_an_unknown_id_goes_to_one_replica(
    scripted: list[ScriptedReplica], tiny_llama: Path
) -> None:
    handle = router_over(scripted, tiny_llama, shared_response_store=True)
    try:
        with httpx.Client(base_url=handle.url, timeout=30) as http:
            seen = [len(r.seen) for r in scripted]
            assert http.get("/v1/responses/resp_elsewhere").status_code == 404
            assert sum(len(r.seen) for r in scripted) == sum(seen) + 1
            assert handle.stats()["response_ids"]["shared_store"] is True
    finally:
        handle.stop()


def test_anthropic_headers_reach_the_replica_and_errors_keep_each_protocols_shape(
    scripted: list[ScriptedReplica], tiny_llama: Path
) -> None:
    api = ApiConfig(api_keys={"sk-ant": "acme"})
    handle = router_over(scripted[:1], tiny_llama, api=api)
    anthropic = {"anthropic-version": "2023-06-01", "anthropic-beta": "prompt-caching-2024-07-31"}
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    try:
        with httpx.Client(base_url=handle.url, timeout=30) as http:
            ok = http.post("/v1/messages", json=body, headers={"x-api-key": "sk-ant", **anthropic})
            assert ok.status_code == 200
            seen = scripted[0].seen[-1]
            assert seen.path == "/v1/messages" and seen.headers["x-api-key"] == "sk-ant"
            assert {k: seen.headers[k] for k in anthropic} == anthropic
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            auth = {"authorization": "Bearer sk-ant", "anthropic-version": "2023-06-01"}
            assert http.post("/v1/chat/completions", json=chat, headers=auth).status_code == 200
            seen = scripted[0].seen[-1]
            assert seen.headers["authorization"] == "Bearer sk-ant"
            assert seen.headers["anthropic-version"] == "2023-06-01"
            # the router's own refusals: Anthropic's shape on /v1/messages ...
            denied = http.post("/v1/messages", json=body, headers={"x-api-key": "sk-wrong"})
            assert denied.status_code == 401
            assert denied.json()["type"] == "error"
            assert denied.json()["error"]["type"] == "authentication_error"
            bad = http.post("/v1/messages", content=b"{nope", headers={"x-api-key": "sk-ant"})
            assert bad.status_code == 400
            assert bad.json()["error"]["type"] == "invalid_request_error"
            # ... OpenAI's on /v1/responses
            bad = http.post("/v1/responses", content=b"[1]", headers=auth)
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    finally:
        handle.stop()


def test_no_replica_is_a_503_in_each_protocols_shape(tiny_llama: Path) -> None:
    doomed = ScriptedReplica("doomed")
    handle = router_over([doomed], tiny_llama)
    try:
        doomed.stop()
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
    finally:
        handle.stop()


def test_a_stream_cut_mid_way_ends_with_the_protocols_error_event(
    scripted: list[ScriptedReplica], tiny_llama: Path
) -> None:
    handle = router_over(scripted[:1], tiny_llama)
    try:
        with httpx.Client(base_url=handle.url, timeout=30) as http:
            responses = http.post("/v1/responses", json={"input": "x", "stream": True, "die": 1})
            *_, last = responses.text.strip().split("\n\n")
            assert last.startswith("event: error\ndata: ")
            assert json.loads(last.split("data: ", 1)[1])["code"] == "replica_failed"
            body = {"messages": [{"role": "user", "content": "x"}], "stream": True, "die": 1}
            messages = http.post("/v1/messages", json=body)
            *_, last = messages.text.strip().split("\n\n")
            error = json.loads(last.split("data: ", 1)[1])
            assert last.startswith("event: error\n") and error["error"]["type"] == "api_error"
        assert handle.state.stats()["replicas"]["r0"]["failures"] == 2
    finally:
        handle.stop()
