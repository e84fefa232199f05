"""Tool calls that cannot run away, through the official openai client against real servers on
the built-in default model, one per tool-call format (hermes by its template, mistral and
llama3_json by --tool-call-parser): a named call on an integer parameter ends with a bounded
number; cut by max_tokens at every point, it comes back, whole and streamed alike, as one call
holding the arguments written so far, finish_reason "length", and no markup in content."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from api.config import ApiConfig
from tests.api.servers import Server, engine_config, start_server

LOOKUP = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Where an order is",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "integer"}},
                "required": ["order_id"],
            },
        },
    }
]
ASK = [{"role": "user", "content": "Where is my order 42?"}]
NAMED = {"type": "function", "function": {"name": "lookup_order"}}
MARKUP = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", '"name"')


@pytest.fixture(scope="module", params=["hermes", "mistral", "llama3_json"])
def server(request: Any, default_server: Server, default_model_path: Path) -> Iterator[Server]:
    if request.param == "hermes":  # the default model's template teaches hermes
        yield default_server
        return
    cfg = engine_config(default_model_path, max_model_len=2048, deterministic=True)
    handle = start_server(cfg, ApiConfig(tool_call_parser=request.param), healthy_timeout_s=600)
    yield handle
    handle.stop()


def _ask(server: Server, **kw: Any) -> Any:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    args = dict(model=server.model, messages=ASK, tools=LOOKUP, tool_choice=NAMED, temperature=0)
    return client.chat.completions.create(**{**args, **kw})


def _streamed(server: Server, max_tokens: int) -> tuple[str, list[tuple[str, str]], str | None]:
    content, calls, reason = "", {}, None
    for chunk in _ask(server, max_tokens=max_tokens, stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for tc in choice.delta.tool_calls or []:
            if tc.id is not None:
                calls[tc.index] = [tc.function.name, tc.function.arguments or ""]
            else:
                calls[tc.index][1] += tc.function.arguments or ""
        reason = choice.finish_reason or reason
    return content, [tuple(c) for c in calls.values()], reason


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def test_a_named_call_on_an_integer_ends_with_a_bounded_number(server: Server) -> None:
    choice = _ask(server, max_tokens=120).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls or []
    order_id = json.loads(call.function.arguments)["order_id"]
    assert isinstance(order_id, int) and len(str(abs(order_id))) <= 19


def test_a_call_cut_at_every_point_is_a_call_with_its_arguments_so_far(
    server: Server, request: pytest.FixtureRequest
) -> None:
    full = _ask(server, max_tokens=120)
    (whole_call,) = full.choices[0].message.tool_calls or []
    # as generated: hermes calls are forced in its template's spelling (", ", ": "), the others
    # compact (mistral and llama3_json calls re-serialize a closed call's arguments)
    arguments = whole_call.function.arguments
    if request.node.callspec.params["server"] != "hermes":
        arguments = json.dumps(json.loads(arguments), separators=(",", ":"))
    partial_seen = False
    for max_tokens in range(1, full.usage.completion_tokens):
        choice = _ask(server, max_tokens=max_tokens).choices[0]
        assert choice.finish_reason == "length"
        content = choice.message.content
        assert content is None or not any(m in content for m in MARKUP), (max_tokens, content)
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        if calls:
            ((name, args),) = calls
            assert name == "lookup_order", (max_tokens, name)
            if _is_json(args):  # a closed call (its arguments as the parser serializes them)
                assert json.loads(args) == json.loads(arguments), (max_tokens, args)
            else:  # the arguments so far, as written
                assert arguments.startswith(args), (max_tokens, args)
                partial_seen |= args != ""
        streamed = _streamed(server, max_tokens)
        assert streamed == (content or "", calls, "length"), max_tokens
    assert partial_seen  # some cut fell inside the arguments
