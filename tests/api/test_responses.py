"""/v1/responses through the official openai client against real servers on the tiny model:
string and item input, instructions, the stream's events, retrieve and delete, previous_response_id
(the earlier conversation in the prompt and in the cache), a function-call round trip, text.format
json_schema, a call cut by max_output_tokens, tenants, store=false, and refusals."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.api.servers import API_KEYS, BLOCK_SIZE, Server, fresh_text

SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"enum": [1, 2, 3]}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
FORMAT = {"format": {"type": "json_schema", "name": "trip", "schema": SCHEMA, "strict": True}}
# a tool whose forced call is bounded (its one argument an enum)
TOOLS = [
    {
        "type": "function",
        "name": "weather",
        "description": "w",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    }
]
CALL = {"type": "function", "name": "weather"}
MARKUP = ("<tool_call>", "</tool_call>", '"name"')


def _client(server: Server, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return _client(server)


@pytest.fixture(scope="module")
def tools_client(long_server: Server) -> openai.OpenAI:
    return _client(long_server)


def _create(client: openai.OpenAI, server: Server, **kw: Any) -> Any:
    return client.responses.create(**{"model": server.model, "temperature": 0, **kw})


def test_string_input_with_instructions_is_the_chat_prompt(
    client: openai.OpenAI, server: Server
) -> None:
    text = fresh_text(30, 1)
    out = _create(client, server, input=text, instructions="Be brief.", max_output_tokens=8)
    assert out.id.startswith("resp_") and out.object == "response"
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    [message] = out.output
    assert message.type == "message" and message.id.startswith("msg_")
    assert message.role == "assistant" and message.status == "incomplete"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    assert out.usage.output_tokens == 8 and out.output_text == message.content[0].text
    assert out.instructions == "Be brief." and out.max_output_tokens == 8
    assert out.temperature == 0 and out.store is True and out.tools == []
    chat = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
        max_tokens=8,
        temperature=0,
    )
    assert out.usage.input_tokens == chat.usage.prompt_tokens
    assert out.output_text == chat.choices[0].message.content


def test_item_input_is_the_same_prompt_as_a_string(client: openai.OpenAI, server: Server) -> None:
    text = fresh_text(30, 2)
    plain = _create(client, server, input=text, max_output_tokens=6)
    parts = [{"type": "input_text", "text": text[:10]}, {"type": "input_text", "text": text[10:]}]
    items = _create(
        client, server, input=[{"type": "message", "role": "user", "content": parts}], max_output_tokens=6
    )
    assert items.output_text == plain.output_text
    assert items.usage.input_tokens == plain.usage.input_tokens


def test_json_schema_output_validates(client: openai.OpenAI, server: Server) -> None:
    out = _create(client, server, input=fresh_text(20, 3), text=FORMAT, max_output_tokens=60)
    assert out.status == "completed" and out.usage.output_tokens < 60
    jsonschema.validate(json.loads(out.output_text), SCHEMA)
    assert out.text.format.type == "json_schema" and out.text.format.name == "trip"


def test_stream_events_in_order_and_deltas_make_the_text(
    client: openai.OpenAI, server: Server
) -> None:
    text = fresh_text(20, 4)
    events = list(_create(client, server, input=text, text=FORMAT, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    deltas = kinds[4:-4]
    assert deltas and set(deltas) == {"response.output_text.delta"}
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == final.output_text == events[-4].text
    jsonschema.validate(json.loads(streamed), SCHEMA)
    whole = _create(client, server, input=text, text=FORMAT)
    assert whole.output_text == streamed
    with client.responses.stream(
        model=server.model, input=text, text=FORMAT, temperature=0
    ) as stream:
        assert stream.get_final_response().output_text == streamed


def test_retrieve_and_delete(client: openai.OpenAI, server: Server) -> None:
    out = _create(client, server, input=fresh_text(20, 5), max_output_tokens=4)
    got = client.responses.retrieve(out.id)
    assert got.id == out.id and got.output_text == out.output_text and got.usage == out.usage
    assert client.responses.delete(out.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(out.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(out.id)


def test_unknown_id_is_openais_404(server: Server) -> None:
    for method in ("GET", "DELETE"):
        reply = httpx.request(method, server.url + "/v1/responses/resp_nope")
        assert reply.status_code == 404
        error = reply.json()["error"]
        assert "resp_nope" in error["message"] and set(error) == {"message", "type", "param", "code"}


def test_store_false_keeps_nothing(client: openai.OpenAI, server: Server) -> None:
    out = _create(client, server, input=fresh_text(20, 6), max_output_tokens=4, store=False)
    assert out.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(out.id)
    with pytest.raises(openai.BadRequestError) as caught:
        _create(client, server, input="more", previous_response_id=out.id, max_output_tokens=4)
    assert caught.value.body["param"] == "previous_response_id"
    assert caught.value.body["code"] == "previous_response_not_found"


def test_previous_response_continues_the_conversation_from_the_cache(
    client: openai.OpenAI, server: Server
) -> None:
    # an ASCII answer (JSON), so the third turn's re-rendered text is the same tokens
    first = _create(client, server, input=fresh_text(60, 7), instructions="Be brief.", text=FORMAT)
    earlier = first.usage.total_tokens  # its prompt and output, all in the next prompt
    second = _create(
        client,
        server,
        input=fresh_text(20, 8),
        instructions="Be brief.",
        previous_response_id=first.id,
        max_output_tokens=4,
    )
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > earlier
    # every full block of the earlier turn hits, its generated tokens included
    assert second.usage.input_tokens_details.cached_tokens == earlier // BLOCK_SIZE * BLOCK_SIZE
    # instructions are not carried over: without them the system message is gone
    third = _create(
        client, server, input=fresh_text(20, 8), previous_response_id=first.id, max_output_tokens=4
    )
    system = server.engine.tokenizer.encode(
        "<|im_start|>system\nBe brief.<|im_end|>\n", add_special_tokens=False
    )
    assert third.usage.input_tokens == second.usage.input_tokens - len(system)


def test_function_call_round_trip(tools_client: openai.OpenAI, long_server: Server) -> None:
    first = _create(
        tools_client,
        long_server,
        input="Weather in Paris?",
        instructions="x",
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=120,
    )
    assert first.status == "completed"
    [call] = first.output
    assert call.type == "function_call" and call.name == "weather" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert first.tool_choice == "required" and first.tools[0].name == "weather"
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    second = _create(
        tools_client,
        long_server,
        input=[answer],
        instructions="x",
        tools=TOOLS,
        previous_response_id=first.id,
        max_output_tokens=4,
    )
    assert second.usage.input_tokens > first.usage.total_tokens
    # the earlier prompt hits whole; its call re-rendered by the template, as far as it spells it
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached >= first.usage.input_tokens // BLOCK_SIZE * BLOCK_SIZE
    # the same conversation sent whole, as items (what a client without the store sends)
    resent = [{"role": "user", "content": "Weather in Paris?"}, call.model_dump(exclude_none=True), answer]
    whole = _create(
        tools_client, long_server, input=resent, instructions="x", tools=TOOLS, max_output_tokens=4
    )
    assert whole.output_text == second.output_text


def test_cut_call_is_a_function_call_item(tools_client: openai.OpenAI, long_server: Server) -> None:
    kw: dict[str, Any] = dict(input="Weather?", instructions="x", tools=TOOLS, tool_choice=CALL)
    out = _create(tools_client, long_server, max_output_tokens=50, **kw)
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    [call] = out.output
    assert call.type == "function_call" and call.status == "incomplete" and call.name == "weather"
    assert not any(m in call.arguments for m in MARKUP)
    events = list(_create(tools_client, long_server, max_output_tokens=50, stream=True, **kw))
    kinds = [e.type for e in events]
    assert "response.output_text.delta" not in kinds and kinds[-1] == "response.incomplete"
    streamed = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    done = events[-1].response.output[0]
    assert done.type == "function_call" and done.arguments == streamed == call.arguments


def test_tenants_see_only_their_own(auth_server: Server) -> None:
    [alice_key, bob_key] = sorted(API_KEYS)
    alice, bob = _client(auth_server, alice_key), _client(auth_server, bob_key)
    out = _create(alice, auth_server, input=fresh_text(20, 9), max_output_tokens=4)
    assert alice.responses.retrieve(out.id).id == out.id
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(out.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(out.id)
    with pytest.raises(openai.BadRequestError):
        _create(bob, auth_server, input="x", previous_response_id=out.id, max_output_tokens=4)
    reply = httpx.get(auth_server.url + f"/v1/responses/{out.id}")
    assert reply.status_code == 401
    assert alice.responses.retrieve(out.id).id == out.id  # bob's delete did nothing


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input.0"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ],
)
def test_unhonoured_fields_are_refused_by_name(
    server: Server, extra: dict[str, Any], param: str
) -> None:
    body = {"model": server.model, "input": "hi", **extra}
    reply = httpx.post(server.url + "/v1/responses", json=body)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param
