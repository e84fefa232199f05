"""Tool calling through the official openai client against a real server on the built-in default
model (SmolLM2-135M-Instruct, whose ChatML template gets radixcache's hermes tool template):
every tool_choice, whole and streamed, a whole tool loop, the cached tools block, and the
router's ids for a request with tools."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from api.openai.protocol import ChatCompletionRequest
from api.openai.tool_plan import NO_PARAMETERS
from api.router.tokenize import PromptTokenizer
from tests.api.servers import BLOCK_SIZE, Server
from tests.api.tool_cases import WEATHER_TOOLS

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
PARAMETERS = {t["function"]["name"]: t["function"].get("parameters") for t in WEATHER_TOOLS}


@pytest.fixture(scope="module")
def client(default_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=default_server.url + "/v1", api_key="none", max_retries=0)


def _ask(client: openai.OpenAI, server: Server, **kw: Any) -> Any:
    args: dict[str, Any] = dict(model=server.model, messages=ASK, tools=WEATHER_TOOLS)
    return client.chat.completions.create(**{**args, "temperature": 0, "max_tokens": 60, **kw})


def _valid(name: str, arguments: str) -> None:
    assert name in PARAMETERS
    jsonschema.validate(json.loads(arguments), PARAMETERS[name] or NO_PARAMETERS)


def _streamed_calls(stream: Any) -> tuple[list[tuple[str, str]], str | None, str]:
    """(name, concatenated arguments) per call as the deltas built them, the finish reason and
    the streamed content."""
    calls: dict[int, list[str]] = {}
    reason, content = None, ""
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for tc in choice.delta.tool_calls or []:
            if tc.id is not None:  # a call's first delta: id, type, name and arguments ""
                assert tc.id.startswith("call_") and tc.type == "function"
                assert tc.function.arguments == "" and tc.index not in calls
                calls[tc.index] = [tc.function.name, ""]
            else:
                calls[tc.index][1] += tc.function.arguments or ""
        reason = choice.finish_reason or reason
    return [(n, a) for _, (n, a) in sorted(calls.items())], reason, content


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_time"}}],
    ids=["required", "named-parameterless"],
)
def test_forced_calls_are_valid_whole_and_streamed(
    client: openai.OpenAI, default_server: Server, tool_choice: Any
) -> None:
    kw = dict(tool_choice=tool_choice, parallel_tool_calls=False)
    whole = _ask(client, default_server, **kw).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    calls = whole.message.tool_calls
    assert calls is not None and len(calls) == 1 and calls[0].id.startswith("call_")
    _valid(calls[0].function.name, calls[0].function.arguments)
    if isinstance(tool_choice, dict):
        assert calls[0].function.name == "get_time" and calls[0].function.arguments == "{}"
    streamed, reason, content = _streamed_calls(_ask(client, default_server, stream=True, **kw))
    assert reason == "tool_calls" and content == ""
    assert streamed == [(calls[0].function.name, calls[0].function.arguments)]


def test_required_with_parallel_calls_gives_only_valid_calls(
    client: openai.OpenAI, default_server: Server
) -> None:
    choice = _ask(client, default_server, tool_choice="required", max_tokens=90).choices[0]
    calls = choice.message.tool_calls or []
    assert calls, choice
    for call in calls:
        _valid(call.function.name, call.function.arguments)
    assert choice.finish_reason in ("tool_calls", "length")


def test_auto_parses_calls_out_of_the_text_whole_and_streamed(
    client: openai.OpenAI, default_server: Server
) -> None:
    # the output is held to a hermes call by a regex, so what auto must parse is known
    regex = (
        r'I will check\.\n<tool_call>\n\{"name": "get_weather", "arguments": '
        r'\{"city": "(Paris|Rome)"\}\}\n</tool_call>'
    )
    kw = dict(tool_choice="auto", extra_body={"structured_outputs": {"regex": regex}})
    whole = _ask(client, default_server, **kw).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert whole.message.content == "I will check.\n"
    (call,) = whole.message.tool_calls or []
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    streamed, reason, content = _streamed_calls(_ask(client, default_server, stream=True, **kw))
    assert reason == "tool_calls" and content == "I will check.\n"
    assert streamed == [(call.function.name, call.function.arguments)]


def test_auto_and_none_answer_free_text(client: openai.OpenAI, default_server: Server) -> None:
    free = _ask(client, default_server, tool_choice="none", max_tokens=12).choices[0]
    assert free.message.tool_calls is None and free.message.content
    assert free.finish_reason in ("stop", "length")
    auto = _ask(client, default_server, max_tokens=40).choices[0]  # tool_choice defaults to auto
    if auto.message.tool_calls:
        assert auto.finish_reason == "tool_calls"
        for call in auto.message.tool_calls:
            assert call.function.name in PARAMETERS
    else:
        assert auto.message.content and "<tool_call>" not in auto.message.content[:1]


def test_a_whole_tool_loop(client: openai.OpenAI, default_server: Server) -> None:
    first = _ask(client, default_server, tool_choice="required", parallel_tool_calls=False)
    message = first.choices[0].message
    (call,) = message.tool_calls or []
    messages = [
        *ASK,
        message,  # the client sends our own answer back: role, content null, tool_calls
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    final = _ask(client, default_server, messages=messages, tool_choice="none", max_tokens=16)
    answer = final.choices[0]
    assert answer.message.content and answer.message.tool_calls is None
    # the first call's prompt (tools block and question) and its call are served from the cache:
    # the forced call is spelled as the template renders it given back
    cached = final.usage.prompt_tokens_details.cached_tokens
    whole_turn = first.usage.prompt_tokens + first.usage.completion_tokens
    assert cached >= whole_turn // BLOCK_SIZE * BLOCK_SIZE - BLOCK_SIZE, (cached, first.usage)


def test_a_second_call_with_the_same_tools_hits_the_whole_tools_block(
    client: openai.OpenAI, default_server: Server, default_model_path: Path
) -> None:
    system = {"role": "system", "content": f"You are agent {uuid.uuid4().hex}."}
    renderer = PromptTokenizer(default_model_path)

    def ask(question: str) -> Any:
        messages = [system, {"role": "user", "content": question}]
        return _ask(client, default_server, messages=messages, tool_choice="none", max_tokens=1)

    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [system, ASK[0]], "tools": WEATHER_TOOLS}, strict=False
    )
    text = renderer.render(request.chat_prompt())
    block = text[: text.index("<|im_end|>") + len("<|im_end|>")]  # system prompt + tools
    assert "get_weather" in block
    block_tokens = len(renderer.encode(block, add_special_tokens=False))
    full_blocks = block_tokens // BLOCK_SIZE * BLOCK_SIZE
    first = ask("Is it raining in Oslo?")
    assert first.usage.prompt_tokens_details.cached_tokens < full_blocks
    second = ask("And how warm is it in Lima today?")
    assert second.usage.prompt_tokens_details.cached_tokens >= full_blocks
    # the cache lookup renders a chat with its tools as the route does
    body = {"messages": [system, {"role": "user", "content": "Snow?"}], "tools": WEATHER_TOOLS}
    found = httpx.post(default_server.url + "/v1/cache/lookup", json=body, timeout=60).json()
    assert found["cached_tokens"] >= full_blocks
    without = httpx.post(default_server.url + "/v1/cache/lookup", json={**body, "tools": None})
    assert without.json()["cached_tokens"] < full_blocks


def test_the_router_renders_tools_to_the_server_s_very_ids(
    default_server: Server, default_model_path: Path
) -> None:
    body = {
        "model": default_server.model,
        "messages": [
            {"role": "system", "content": "Use tools when they help."},
            *ASK,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_x",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_x", "content": "sunny"},
        ],
        "tools": WEATHER_TOOLS,
        "max_tokens": 1,
        "return_token_ids": True,
    }
    served = httpx.post(default_server.url + "/v1/chat/completions", json=body, timeout=120)
    assert served.status_code == 200, served.text
    router = PromptTokenizer(default_model_path)
    request = ChatCompletionRequest.model_validate(body, strict=False)
    assert router.chat(request.chat_prompt()) == served.json()["choices"][0]["prompt_token_ids"]
    ids, tail = router.chat_for_routing(request.chat_prompt())
    assert list(ids) + router.segments.encode(tail) == router.chat(request.chat_prompt())


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER_TOOLS[0], WEATHER_TOOLS[0]]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}
                ],
                "tool_choice": "required",
            },
            "tool_choice",
        ),
    ],
    ids=["unknown-name", "no-tools", "duplicate", "bad-name", "with-format", "bad-schema"],
)
def test_bad_tool_requests_are_400s(default_server: Server, change: dict, param: str) -> None:
    body = {"model": default_server.model, "messages": ASK, "tools": WEATHER_TOOLS, **change}
    body = {k: v for k, v in body.items() if v is not None}
    r = httpx.post(default_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"] or "").startswith(param), r.json()
