"""Structured outputs through the official openai client against a real server on the default
model: response_format (json_schema, json_object, a pydantic model through .parse), vLLM's
structured_outputs on chat and completions, logit_bias, and the 400s for what the server will not
honour (unknown fields, bad or unsupported schemas)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.api.servers import Server
from tests.api.tool_cases import SCHEMAS

ASK = [{"role": "user", "content": "Describe the weather in Paris as JSON."}]


@pytest.fixture(scope="module")
def client(default_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=default_server.url + "/v1", api_key="none", max_retries=0)


def _schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


def _chat(client: openai.OpenAI, server: Server, **kw: Any) -> Any:
    args: dict[str, Any] = dict(model=server.model, messages=ASK, temperature=0, max_tokens=80)
    return client.chat.completions.create(**{**args, **kw})


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_outputs_validate(
    client: openai.OpenAI, default_server: Server, name: str
) -> None:
    choice = _chat(client, default_server, response_format=_schema_format(SCHEMAS[name])).choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])


def test_a_streamed_json_schema_output_is_the_whole_one(
    client: openai.OpenAI, default_server: Server
) -> None:
    fmt = _schema_format(SCHEMAS["nested"])
    whole = _chat(client, default_server, response_format=fmt).choices[0].message.content
    stream = _chat(client, default_server, response_format=fmt, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == whole
    jsonschema.validate(json.loads(streamed), SCHEMAS["nested"])


class Weather(BaseModel):
    city: str = Field(max_length=12)
    celsius: int = Field(ge=-50, le=50)
    sunny: bool


def test_parse_returns_the_pydantic_object(client: openai.OpenAI, default_server: Server) -> None:
    got = client.chat.completions.parse(
        model=default_server.model, messages=ASK, response_format=Weather, max_tokens=60
    )
    parsed = got.choices[0].message.parsed
    assert isinstance(parsed, Weather) and -50 <= parsed.celsius <= 50


def test_n3_samples_all_match_the_schema(client: openai.OpenAI, default_server: Server) -> None:
    fmt = _schema_format(SCHEMAS["enum"])
    got = _chat(client, default_server, response_format=fmt, n=3, temperature=1.0, seed=7)
    assert [c.index for c in got.choices] == [0, 1, 2]
    for choice in got.choices:
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS["enum"])


def test_json_object_and_a_mixed_batch_of_constrained_and_free_rows(
    default_server: Server,
) -> None:
    async def run() -> list[Any]:
        aclient = openai.AsyncOpenAI(
            base_url=default_server.url + "/v1", api_key="none", max_retries=0
        )
        args: dict[str, Any] = dict(model=default_server.model, messages=ASK, max_tokens=40)
        jobs = [
            aclient.chat.completions.create(**args, response_format={"type": "json_object"}),
            aclient.chat.completions.create(**args, temperature=0),
            aclient.chat.completions.create(
                **args, response_format=_schema_format(SCHEMAS["array"])
            ),
            aclient.chat.completions.create(**args, temperature=0.7, seed=3),
        ]
        try:
            return await asyncio.gather(*jobs)
        finally:
            await aclient.close()

    obj, free, array, free2 = asyncio.run(run())
    if obj.choices[0].finish_reason == "stop":  # any object: it may run past 40 tokens
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    else:
        assert obj.choices[0].message.content.startswith("{")
    jsonschema.validate(json.loads(array.choices[0].message.content), SCHEMAS["array"])
    assert free.choices[0].message.content and free2.choices[0].message.content


def test_structured_outputs_regex_choice_and_grammar_on_chat_and_completions(
    client: openai.OpenAI, default_server: Server
) -> None:
    so = {"choice": ["sunny", "rainy", "foggy"]}
    chat = _chat(client, default_server, extra_body={"structured_outputs": so})
    assert chat.choices[0].message.content in so["choice"]
    done = client.completions.create(
        model=default_server.model,
        prompt="The date today is ",
        max_tokens=20,
        temperature=0,
        extra_body={"structured_outputs": {"regex": r"20[0-9]{2}-[01][0-9]-[0-3][0-9]"}},
    )
    assert len(done.choices[0].text) == 10 and done.choices[0].text.startswith("20")
    grammar = 'start: "yes" | "no"'
    gram = _chat(client, default_server, extra_body={"structured_outputs": {"grammar": grammar}})
    assert gram.choices[0].message.content in ("yes", "no")


def test_logit_bias_moves_the_greedy_choice(client: openai.OpenAI, default_server: Server) -> None:
    tokenizer = default_server.engine.tokenizer
    target = tokenizer.encode(" banana", add_special_tokens=False)[0]
    got = _chat(client, default_server, logit_bias={str(target): 100}, max_tokens=3)
    assert got.choices[0].message.content == tokenizer.decode([target] * 3)
    banned = _chat(client, default_server, max_tokens=1)
    first = tokenizer.encode(banned.choices[0].message.content, add_special_tokens=False)[0]
    other = _chat(client, default_server, logit_bias={str(first): -100}, max_tokens=1)
    assert other.choices[0].message.content != banned.choices[0].message.content


BAD = [
    ({"frequency_penality": 0.5}, "frequency_penality", "Unrecognized request argument"),
    ({"messages": [{"role": "user", "content": "hi", "audio": {}}]}, "messages.0.audio", None),
    ({"response_format": _schema_format({"type": "objekt"})}, "response_format", "objekt"),
    ({"response_format": _schema_format({"if": {"type": "string"}, "then": {}})}, None, "if"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", None),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json", None),
    ({"structured_outputs": {"grammar": "start: ("}}, "structured_outputs", None),
    ({"logit_bias": {"abc": 1}}, "logit_bias", None),
    ({"logit_bias": {"\u00b2": 1}}, "logit_bias", None),  # a digit to str.isdigit, not to int
    ({"logit_bias": {"5": 101}}, "logit_bias", None),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", None),
    ({"response_format": {"type": "xml"}}, "response_format", None),
]


@pytest.mark.parametrize(("change", "param", "says"), BAD)
def test_what_the_server_will_not_honour_is_a_400(
    default_server: Server, change: dict, param: str | None, says: str | None
) -> None:
    body = {"model": default_server.model, "messages": ASK, "max_tokens": 4, **change}
    r = httpx.post(default_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if param is not None:
        assert (error["param"] or "").startswith(param), error
    if says is not None:
        assert says in error["message"]


def test_the_allow_listed_fields_are_accepted(default_server: Server) -> None:
    body = {
        "model": default_server.model,
        "messages": ASK,
        "max_tokens": 1,
        "user": "u1",
        "store": False,
        "metadata": {"run": "1"},
        "service_tier": "auto",
    }
    r = httpx.post(default_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text


def test_the_openapi_schema_states_the_new_fields_and_their_closure(
    default_server: Server,
) -> None:
    doc = httpx.get(default_server.url + "/openapi.json", timeout=30).json()
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]
    for name in ("tools", "tool_choice", "response_format", "structured_outputs", "logit_bias"):
        assert name in chat["properties"]
    assert chat["additionalProperties"] is False
