"""Anthropic's Messages API (/v1/messages) through the official anthropic client against the real
test servers (the tiny random-weight Llama, byte-level tokenizer, ChatML template, hermes tools):
system as a string and as blocks, the stream's events, a tool-use loop, cut tool calls, stop
sequences, a prefill, cache_control breakpoints (usage, the pinned prefix surviving a flush, the
lease refreshed and expiring on an injected clock), x-api-key tenants, and Anthropic's error
shape for every refusal."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from api.config import ApiConfig
from api.serving.pin_leases import PinLeases
from radixcache.shared.chat_template import ChatPrompt
from tests.api.servers import ADMIN_KEY, BLOCK_SIZE, Server, engine_config, fresh_text, start_server

HEADERS = {"anthropic-version": "2023-06-01"}
GREEDY = {"temperature": 0}  # the client's create() no longer names the sampling fields
ORDER_TOOL = {
    "name": "lookup_order",
    "description": "Where an order is",
    "input_schema": {
        "type": "object",
        "properties": {"order_id": {"type": "integer"}, "carrier": {"enum": ["ups", "dhl"]}},
        "required": ["order_id", "carrier"],
    },
}
NAMED = {"type": "tool", "name": "lookup_order"}
MARKUP = ("<tool_call>", "</tool_call>", '"name"', '"arguments"')


@pytest.fixture(scope="module")
def client(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def tool_server(tiny_llama: Path) -> Iterator[Server]:
    """The tiny model with room for the hermes tool prompt (over 700 tokens); one request in
    flight at most (its tests run one at a time; the 429 test fills it)."""
    handle = start_server(engine_config(tiny_llama, max_model_len=1024), ApiConfig(max_queue=1))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def tool_client(tool_server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=tool_server.url, api_key="none", max_retries=0)


@pytest.fixture()
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60.0, headers=HEADERS) as c:
        yield c


def _create(client: anthropic.Anthropic, server: Server, **kw: Any) -> Any:
    args: dict[str, Any] = dict(
        model=server.model,
        max_tokens=12,
        messages=[{"role": "user", "content": "Hello there"}],
        extra_body=GREEDY,
    )
    return client.messages.create(**{**args, **kw})


def _text(message: Any) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def _ids(server: Server, text: str) -> list[int]:
    return list(server.engine.tokenizer.encode(text, add_special_tokens=False))


def _chatml(*turns: tuple[str, str], generation: bool = True) -> str:
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    return text + ("<|im_start|>assistant\n" if generation else "")


def _usage_total(usage: Any) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


# ---------------------------------------------------------------- whole and streamed


def test_system_string_and_blocks_render_the_same_prompt(
    client: anthropic.Anthropic, server: Server
) -> None:
    system = "You are terse.\n\nAnswer in one line."
    as_string = _create(client, server, system=system)
    blocks = [
        {"type": "text", "text": "You are terse."},
        {"type": "text", "text": "Answer in one line."},
    ]
    as_blocks = _create(client, server, system=blocks)
    prompt = _ids(server, _chatml(("system", system), ("user", "Hello there")))
    for m in (as_string, as_blocks):
        assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
        assert m.model == server.model
        assert _usage_total(m.usage) == len(prompt)
        assert m.usage.cache_creation_input_tokens == 0  # no breakpoint: nothing written
        assert m.stop_reason in ("end_turn", "max_tokens")
        assert 0 < m.usage.output_tokens <= 12
    assert _text(as_string) == _text(as_blocks)


def test_count_tokens_counts_the_prompt(
    tool_client: anthropic.Anthropic, tool_server: Server
) -> None:
    kw: dict[str, Any] = dict(
        system="Be brief.", tools=[ORDER_TOOL], messages=[{"role": "user", "content": "Hi"}]
    )
    counted = tool_client.messages.count_tokens(model=tool_server.model, **kw)
    ran = _create(tool_client, tool_server, max_tokens=1, tool_choice={"type": "none"}, **kw)
    assert counted.input_tokens == _usage_total(ran.usage) > 600  # the tools are in the prompt
    with pytest.raises(anthropic.BadRequestError) as err:
        tool_client.messages.count_tokens(
            model=tool_server.model, **kw, extra_body={"max_tokens": 4}
        )
    assert "'max_tokens'" in err.value.body["error"]["message"]


def test_stream_events_in_order_and_deltas_make_the_message(
    client: anthropic.Anthropic, server: Server
) -> None:
    whole = _create(client, server, max_tokens=16)
    raw = list(_create(client, server, max_tokens=16, stream=True))
    kinds = [e.type for e in raw]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert raw[0].message.content == [] and raw[0].message.usage.input_tokens > 0
    body = kinds[1:-2]
    assert body[0] == "content_block_start" and body[-1] == "content_block_stop"
    assert set(body[1:-1]) == {"content_block_delta"}
    text = "".join(e.delta.text for e in raw if e.type == "content_block_delta")
    assert text == _text(whole)
    assert raw[-2].delta.stop_reason == whole.stop_reason
    assert raw[-2].usage.output_tokens == whole.usage.output_tokens
    with client.messages.stream(
        model=server.model,
        max_tokens=16,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "Hello there"}],
    ) as stream:
        streamed_text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed_text == _text(final) == _text(whole)
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_stream_pings_after_message_start(server: Server, http: httpx.Client) -> None:
    body = {"model": server.model, "max_tokens": 4, "stream": True, "temperature": 0}
    body["messages"] = [{"role": "user", "content": "Hi"}]
    with http.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200
        events = [line[len("event: ") :] for line in r.iter_lines() if line.startswith("event: ")]
    assert events[:2] == ["message_start", "ping"]


def test_stop_sequence_is_reported(client: anthropic.Anthropic, server: Server) -> None:
    free = _text(_create(client, server, max_tokens=24))
    stop = next(free[i : i + 2] for i in range(3, len(free) - 2) if free[i : i + 2].isprintable())
    cut = _create(client, server, max_tokens=24, stop_sequences=["\x00never", stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert _text(cut) == free[: free.index(stop)]


def test_prefill_continues_the_assistant_turn(client: anthropic.Anthropic, server: Server) -> None:
    messages = [
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Sure:"},
    ]
    m = _create(client, server, messages=messages)
    prompt = _chatml(("user", "Hello there")) + "Sure:"
    assert _usage_total(m.usage) == len(_ids(server, prompt))
    with pytest.raises(anthropic.BadRequestError) as err:
        _create(client, server, messages=[messages[0], {"role": "assistant", "content": "Sure "}])
    assert "trailing whitespace" in err.value.body["error"]["message"]


# ---------------------------------------------------------------- tools


def _check_input(value: dict[str, Any]) -> None:
    assert set(value) == {"order_id", "carrier"}
    assert isinstance(value["order_id"], int) and value["carrier"] in ("ups", "dhl")


def test_tool_use_loop(tool_client: anthropic.Anthropic, tool_server: Server) -> None:
    ask = [{"role": "user", "content": "Where is my order 42?"}]
    first = _create(
        tool_client,
        tool_server,
        max_tokens=160,
        tools=[ORDER_TOOL],
        tool_choice=NAMED,
        messages=ask,
    )
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["tool_use"]
    call = first.content[0]
    assert call.name == "lookup_order" and call.id.startswith("toolu_")
    _check_input(call.input)
    streamed = _create(
        tool_client,
        tool_server,
        max_tokens=160,
        tools=[ORDER_TOOL],
        tool_choice=NAMED,
        messages=ask,
        stream=True,
    )
    events = list(streamed)
    start = next(e for e in events if e.type == "content_block_start")
    assert start.content_block.type == "tool_use" and start.content_block.input == {}
    partial = "".join(
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    )
    assert json.loads(partial) == call.input
    assert events[-2].delta.stop_reason == "tool_use"
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "Shipped, arrives Monday."}
    turn = [
        *ask,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [result]},
    ]
    second = _create(
        tool_client,
        tool_server,
        max_tokens=8,
        tools=[ORDER_TOOL],
        messages=turn,
        tool_choice={"type": "none"},
    )
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert all(b.type == "text" for b in second.content)

    # the answer read the whole loop, as the template renders it in OpenAI's terms
    def rendered(result_text: str) -> int:
        made = {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.input},
        }
        tool = {
            "type": "function",
            "function": {
                "name": "lookup_order",
                "description": "Where an order is",
                "parameters": ORDER_TOOL["input_schema"],
            },
        }
        messages = [
            *ask,
            {"role": "assistant", "content": None, "tool_calls": [made]},
            {
                "role": "tool",
                "content": result_text,
                "tool_call_id": call.id,
                "name": "lookup_order",
            },
        ]
        text = tool_server.state.templates.render(ChatPrompt(messages, [tool]))
        return len(_ids(tool_server, text))

    assert _usage_total(second.usage) == rendered("Shipped, arrives Monday.")
    failed = {**result, "is_error": True}
    turn[-1] = {"role": "user", "content": [failed]}
    third = _create(tool_client, tool_server, max_tokens=2, tools=[ORDER_TOOL], messages=turn)
    assert _usage_total(third.usage) == rendered("Error: Shipped, arrives Monday.")


def test_any_and_disable_parallel_force_one_call(
    tool_client: anthropic.Anthropic, tool_server: Server
) -> None:
    m = _create(
        tool_client,
        tool_server,
        max_tokens=160,
        tools=[ORDER_TOOL],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
    _check_input(m.content[0].input)


def test_cut_tool_call_is_a_tool_use_block(
    tool_client: anthropic.Anthropic, tool_server: Server
) -> None:
    """Cut by max_tokens at many points: never markup in text; once the name is written, one
    tool_use block holding the input so far, whole and streamed alike."""
    kw = dict(tools=[ORDER_TOOL], tool_choice=NAMED)
    seen_partial = False
    for max_tokens in range(30, 110, 4):
        whole = _create(tool_client, tool_server, max_tokens=max_tokens, **kw)
        with tool_client.messages.stream(
            model=tool_server.model,
            max_tokens=max_tokens,
            extra_body=GREEDY,
            messages=[{"role": "user", "content": "Hello there"}],
            **kw,
        ) as stream:
            streamed = stream.get_final_message()
        for m in (whole, streamed):
            assert not any(mark in _text(m) for mark in MARKUP), m
            assert all(b.type == "tool_use" for b in m.content)
            assert len(m.content) <= 1
        if whole.stop_reason == "tool_use":
            break
        assert whole.stop_reason == streamed.stop_reason == "max_tokens"
        assert [b.input for b in whole.content] == [b.input for b in streamed.content]
        if whole.content:
            assert whole.content[0].name == "lookup_order"
            assert set(whole.content[0].input) <= {"order_id", "carrier"}
            seen_partial = True
    assert seen_partial


# ---------------------------------------------------------------- cache_control


class FakeClock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def clock(server: Server, monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    import time

    fake = FakeClock(time.monotonic())
    monkeypatch.setattr(server.state.pin_leases, "clock", fake)
    return fake


def _lookup(http: httpx.Client, ids: list[int]) -> int:
    return http.post("/v1/cache/lookup", json={"prompt": ids}).json()["cached_tokens"]


def test_cache_control_counts_pins_refreshes_and_expires(
    client: anthropic.Anthropic, server: Server, http: httpx.Client, clock: FakeClock
) -> None:
    leases: PinLeases = server.state.pin_leases
    system_text = fresh_text(151, seed=38)
    system = [{"type": "text", "text": system_text, "cache_control": {"type": "ephemeral"}}]
    breakpoint_ids = _ids(server, _chatml(("system", system_text), generation=False))
    b = len(breakpoint_ids)
    assert b % BLOCK_SIZE != 0
    pinned = b // BLOCK_SIZE * BLOCK_SIZE

    first = _create(
        client, server, system=system, messages=[{"role": "user", "content": "first question"}]
    )
    assert first.usage.cache_read_input_tokens == 0  # a fresh system prompt
    assert first.usage.cache_creation_input_tokens == b  # the breakpoint's prefix, written
    assert first.usage.cache_creation.ephemeral_5m_input_tokens == b
    assert first.usage.input_tokens == _usage_total(first.usage) - b
    assert {p: lease.pinned_tokens for p, lease in leases.leases("").items()}.get(
        tuple(breakpoint_ids)
    ) == pinned

    # the pinned prefix survives a flush; what follows it does not
    assert http.post("/v1/cache/flush", json={}).status_code == 200
    assert _lookup(http, breakpoint_ids) == pinned
    later = _ids(server, _chatml(("system", system_text), ("user", "first question")))
    assert _lookup(http, later) == pinned

    second = _create(
        client, server, system=system, messages=[{"role": "user", "content": "second one"}]
    )
    assert second.usage.cache_read_input_tokens == pinned  # the breakpoint's blocks, read
    assert second.usage.cache_creation_input_tokens == b - pinned
    assert _usage_total(second.usage) == len(
        _ids(server, _chatml(("system", system_text), ("user", "second one")))
    )

    clock.now += 200  # a hit refreshes the 5 minute lease
    _create(client, server, system=system, messages=[{"role": "user", "content": "third"}])
    clock.now += 150  # 350 s after the first, 150 s after the refresh
    leases.sweep()
    assert tuple(breakpoint_ids) in leases.leases("")
    clock.now += 151  # 5 minutes after the last hit: the lease ends and the prefix is unpinned
    leases.sweep()
    assert tuple(breakpoint_ids) not in leases.leases("")
    http.post("/v1/cache/flush", json={})
    assert _lookup(http, breakpoint_ids) == 0


def test_one_hour_breakpoint_and_top_level_cache_control(
    client: anthropic.Anthropic, server: Server, clock: FakeClock
) -> None:
    leases: PinLeases = server.state.pin_leases
    system_text = fresh_text(90, seed=39)
    system = [
        {"type": "text", "text": system_text, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    ]
    question = fresh_text(40, seed=40)
    m = _create(
        client,
        server,
        system=system,
        messages=[{"role": "user", "content": question}],
        cache_control={"type": "ephemeral"},
    )
    sys_end = len(_ids(server, _chatml(("system", system_text), generation=False)))
    whole_turn = _ids(
        server, _chatml(("system", system_text), ("user", question), generation=False)
    )
    assert m.usage.cache_creation_input_tokens == len(whole_turn)  # up to the last breakpoint
    assert m.usage.cache_creation.ephemeral_1h_input_tokens == sys_end
    assert m.usage.cache_creation.ephemeral_5m_input_tokens == len(whole_turn) - sys_end
    held = leases.leases("")
    assert tuple(whole_turn[:sys_end]) in held and tuple(whole_turn) in held
    clock.now += 301  # the 5 minute one ends, the hour one stays
    leases.sweep()
    held = leases.leases("")
    assert tuple(whole_turn[:sys_end]) in held and tuple(whole_turn) not in held
    clock.now += 3600
    leases.sweep()
    assert tuple(whole_turn[:sys_end]) not in leases.leases("")


def test_x_api_key_tenants_are_isolated(auth_server: Server) -> None:
    def as_key(key: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=auth_server.url, api_key=key, max_retries=0)

    system_text = fresh_text(120, seed=41)
    system = [{"type": "text", "text": system_text, "cache_control": {"type": "ephemeral"}}]
    args = dict(model=auth_server.model, max_tokens=4, extra_body=GREEDY, system=system)
    ask = [{"role": "user", "content": "Hi"}]
    alice, bob = as_key("sk-alice"), as_key("sk-bob")
    assert alice.messages.create(**args, messages=ask).usage.cache_creation_input_tokens > 0
    again = alice.messages.create(**args, messages=ask).usage
    assert again.cache_read_input_tokens > 0
    assert bob.messages.create(**args, messages=ask).usage.cache_read_input_tokens == 0
    assert auth_server.state.pin_leases.leases("tenant:alice")
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    rows = httpx.get(f"{auth_server.url}/v1/cache/prefixes", headers=headers).json()["data"]
    assert any(r["cache_salt"] == "tenant:alice" and r["pinned"] for r in rows)
    with pytest.raises(anthropic.AuthenticationError) as err:
        as_key("sk-wrong").messages.create(**args, messages=ask)
    assert err.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Invalid API key"},
    }
    missing = httpx.post(
        f"{auth_server.url}/v1/messages",
        headers=HEADERS,
        json={"model": auth_server.model, "max_tokens": 4, "messages": ask},
    )
    assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"


# ---------------------------------------------------------------- errors


def _refused(
    http: httpx.Client, body: dict[str, Any], status: int = 400, headers: dict | None = None
) -> str:
    r = http.post("/v1/messages", json=body, headers=headers)
    assert r.status_code == status, r.text
    data = r.json()
    assert data["type"] == "error" and set(data["error"]) == {"type", "message"}
    kinds = {400: "invalid_request_error", 404: "not_found_error"}
    assert data["error"]["type"] == kinds[status]
    return data["error"]["message"]


def _body(server: Server, **kw: Any) -> dict[str, Any]:
    return {
        "model": server.model,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}],
        **kw,
    }


@pytest.mark.parametrize("field", ["thinking", "container", "output_config", "n"])
def test_unknown_fields_are_refused_by_name(server: Server, http: httpx.Client, field: str) -> None:
    message = _refused(http, _body(server, **{field: {"type": "enabled"}}))
    assert f"'{field}'" in message


def test_refusals_in_anthropics_shape(server: Server, http: httpx.Client) -> None:
    body = _body(server)
    del body["max_tokens"]
    assert "max_tokens" in _refused(http, body)
    assert "anthropic-version" in _refused(
        http, _body(server), headers={"anthropic-version": "1999-01-01"}
    )
    bare = httpx.post(f"{server.url}/v1/messages", json=_body(server))
    assert bare.status_code == 400 and "anthropic-version" in bare.json()["error"]["message"]
    assert _refused(http, _body(server, model="nope"), status=404)
    image = {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}
    _refused(http, _body(server, messages=[{"role": "user", "content": [image]}]))
    citations = {"type": "text", "text": "Hi", "citations": []}
    assert "citations" in _refused(
        http, _body(server, messages=[{"role": "user", "content": [citations]}])
    )
    marked = {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}
    five = _body(
        server, system=[marked] * 3, messages=[{"role": "user", "content": [marked, marked]}]
    )
    assert "maximum of 4" in _refused(http, five)
    late_hour = {**marked, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    assert "1h" in _refused(http, _body(server, system=[marked, late_hour]))
    assert "ttl" in _refused(
        http,
        _body(server, system=[{**marked, "cache_control": {"type": "ephemeral", "ttl": "2h"}}]),
    )
    assert "tool_choice" in _refused(http, _body(server, tool_choice={"type": "any"}))
    assert "tool_choice" in _refused(
        http, _body(server, tools=[ORDER_TOOL], tool_choice={"type": "tool", "name": "other"})
    )
    nested = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [marked]}
    assert "'messages.0.content.0.tool_result.content.0.cache_control'" in _refused(
        http, _body(server, messages=[{"role": "user", "content": [nested]}])
    )
    assert "content" in _refused(http, _body(server, messages=[{"role": "user", "content": []}]))
    r = http.post("/v1/messages", content=b"{not json")
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "context length" in _refused(http, _body(server, max_tokens=10**6))


def test_queue_full_is_a_rate_limit_error(tool_server: Server) -> None:
    long = {"model": tool_server.model, "prompt": "x", "max_tokens": 1000, "ignore_eos": True}
    with httpx.Client(base_url=tool_server.url, timeout=60.0, headers=HEADERS) as c:
        with c.stream("POST", "/v1/completions", json={**long, "stream": True}) as busy:
            assert busy.status_code == 200, busy.read()
            r = c.post("/v1/messages", json=_body(tool_server))
        assert r.status_code == 429
        error = r.json()
        assert error["type"] == "error" and error["error"]["type"] == "rate_limit_error"


def test_oversized_body_is_request_too_large(server: Server, http: httpx.Client) -> None:
    limit = server.state.config.max_body_bytes

    def chunks() -> Iterator[bytes]:  # no content-length: caught while the route reads
        yield b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "'
        for _ in range(limit // 65536 + 2):
            yield b"x" * 65536
        yield b'"}]}'

    declared = http.post("/v1/messages", json=_body(server, system="x" * (limit + 1)))
    streamed = http.post(
        "/v1/messages", content=chunks(), headers={"content-type": "application/json"}
    )
    for r in (declared, streamed):
        assert r.status_code == 413
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "request_too_large"


def test_breakpoint_on_a_tool_covers_the_tools_block(
    tool_client: anthropic.Anthropic, tool_server: Server
) -> None:
    """The hermes template writes the tools into its system message: a breakpoint on the last
    tool marks that whole message, which a request with other messages shares."""
    marked = {**ORDER_TOOL, "cache_control": {"type": "ephemeral"}}
    kw = dict(max_tokens=2, tools=[marked], tool_choice={"type": "none"})
    first = _create(tool_client, tool_server, messages=[{"role": "user", "content": "one"}], **kw)
    (held,) = tool_server.state.pin_leases.leases("")  # this server's one breakpoint
    b, read = len(held), first.usage.cache_read_input_tokens
    text = tool_server.engine.tokenizer.decode(list(held), skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\n") and text.endswith("</tool_call><|im_end|>\n")
    assert "lookup_order" in text and "user" not in text[-30:]
    assert first.usage.cache_creation_input_tokens == max(b - read, 0)
    second = _create(tool_client, tool_server, messages=[{"role": "user", "content": "two"}], **kw)
    assert second.usage.cache_read_input_tokens >= b // BLOCK_SIZE * BLOCK_SIZE
    assert second.usage.cache_creation_input_tokens == max(
        b - second.usage.cache_read_input_tokens, 0
    )


def test_unknown_paths_and_methods_under_messages_in_anthropics_shape(http: httpx.Client) -> None:
    for r, status in ((http.get("/v1/messages"), 405), (http.post("/v1/messages/batches"), 404)):
        assert r.status_code == status
        assert r.json()["type"] == "error" and r.json()["error"]["message"]
    assert set(http.get("/v1/nothing").json()) == {"error"}  # elsewhere: OpenAI's shape


def test_an_engine_failure_after_the_answer_started_ends_the_stream_with_an_error(
    server: Server, http: httpx.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine dies while the breakpoint is pinned (fault injected at the engine's admin
    call): a stream ends with `event: error`, a whole answer is the error."""
    from engine.async_engine import EngineDead

    def dead(op: Any) -> Any:
        raise EngineDead("the engine thread stopped")

    monkeypatch.setattr(server.state.pin_leases, "_run", dead)
    marked = {
        "type": "text",
        "text": fresh_text(40, seed=42),
        "cache_control": {"type": "ephemeral"},
    }
    body = _body(server, system=[marked], stream=True)
    with http.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200
        kinds = [line[len("event: ") :] for line in r.iter_lines() if line.startswith("event: ")]
    assert kinds[0] == "message_start" and kinds[-1] == "error" and "message_stop" not in kinds
    whole = http.post("/v1/messages", json={**body, "stream": False})
    assert whole.status_code == 503
    assert whole.json()["error"] == {
        "type": "overloaded_error",
        "message": "The engine is unavailable: the engine thread stopped",
    }
