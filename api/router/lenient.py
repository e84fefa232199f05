"""What the router reads of a /v1/responses or /v1/messages body, for routing only and leniently:
the replica validates the request, so whatever is not understood here is left out of the prompt
the router routes on (the prompt is then shorter, and the route a guess), never refused."""

from __future__ import annotations

import json
from typing import Any

from api.errors import ApiError
from radixcache.shared.chat_template import ChatPrompt

TEXT_PARTS = ("input_text", "output_text", "text")


def json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; anything else is a 400 (the router cannot route it)."""
    try:
        data = json.loads(raw) if raw.strip() else None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"Invalid JSON in request body: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "Request body must be a JSON object", code="invalid_json")
    return data


def text_field(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    return value if isinstance(value, str) and value else None


def responses_prompt(body: dict[str, Any]) -> ChatPrompt | None:
    """A Responses request's instructions, input items and function tools as a chat."""
    try:
        messages: list[dict[str, Any]] = []
        if isinstance(body.get("instructions"), str):
            messages.append({"role": "system", "content": body["instructions"]})
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        for item in items or ():
            messages.extend(_response_item(item))
        tools = [_function(t) for t in body.get("tools") or () if t.get("type") == "function"]
        return ChatPrompt(messages, tools or None) if messages else None
    except (AttributeError, TypeError, KeyError):
        return None


def _response_item(item: dict[str, Any]) -> list[dict[str, Any]]:
    kind = item.get("type", "message")
    if kind == "message":
        return [{"role": item["role"], "content": _text(item.get("content"))}]
    if kind == "function_call":
        call = {"name": item["name"], "arguments": _arguments(item.get("arguments"))}
        tool_call = {"id": item.get("call_id"), "type": "function", "function": call}
        return [{"role": "assistant", "content": None, "tool_calls": [tool_call]}]
    if kind == "function_call_output":
        out = item.get("output")
        content = out if isinstance(out, str) else _text(out)
        return [{"role": "tool", "content": content, "tool_call_id": item.get("call_id")}]
    return []


def messages_prompt(body: dict[str, Any]) -> ChatPrompt | None:
    """An Anthropic Messages request's system, messages and tools as a chat."""
    try:
        messages: list[dict[str, Any]] = []
        system = body.get("system")
        if system:
            messages.append({"role": "system", "content": _text(system)})
        for m in body.get("messages") or ():
            messages.extend(_anthropic_message(m))
        tools = [
            {
                "type": "function",
                "function": {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema", {}),
                },
            }
            for t in body.get("tools") or ()
            if "name" in t
        ]
        return ChatPrompt(messages, tools or None) if messages else None
    except (AttributeError, TypeError, KeyError):
        return None


def _anthropic_message(m: dict[str, Any]) -> list[dict[str, Any]]:
    content = m["content"]
    if isinstance(content, str):
        return [{"role": m["role"], "content": content}]
    out: list[dict[str, Any]] = []
    text = _text([b for b in content if b.get("type") == "text"])
    calls = [
        {
            "id": b.get("id"),
            "type": "function",
            "function": {"name": b["name"], "arguments": b.get("input", {})},
        }
        for b in content
        if b.get("type") == "tool_use"
    ]
    for b in content:
        if b.get("type") == "tool_result":
            result = b.get("content")
            result = result if isinstance(result, str) else _text(result)
            out.append({"role": "tool", "content": result, "tool_call_id": b.get("tool_use_id")})
    if text or calls or not out:
        message: dict[str, Any] = {"role": m["role"], "content": text}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    fields = ("name", "description", "parameters")
    return {"type": "function", "function": {k: tool[k] for k in fields if k in tool}}


def _text(content: Any) -> str:
    """A string, or the text of a list of content parts."""
    if isinstance(content, str):
        return content
    if not content:
        return ""
    return "".join(p.get("text", "") for p in content if p.get("type") in TEXT_PARTS)


def _arguments(raw: Any) -> Any:
    """Templates want a call's arguments as an object (as the replicas hand them)."""
    if not isinstance(raw, str):
        return raw
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    return value if isinstance(value, dict) else raw
