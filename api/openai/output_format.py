"""A request's output format in the engine's terms: response_format and vLLM's structured_outputs
-> one Constraint (or none), and the field a constraint that does not compile is blamed on."""

from __future__ import annotations

import json
from typing import Any

from api.errors import ApiError
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from api.openai.protocol_tools import JsonObjectFormat, JsonSchemaFormat, ResponseFormat
from engine.structured.constraints import (
    Choice,
    Constraint,
    Grammar,
    JsonObject,
    Regex,
    json_schema,
)


def output_format(req: CompletionRequest | ChatCompletionRequest) -> tuple[Constraint | None, str]:
    param = "structured_outputs" if req.structured_outputs is not None else "response_format"
    return _constraint(req), param


def _constraint(req: CompletionRequest | ChatCompletionRequest) -> Constraint | None:
    fmt, so = req.response_format, req.structured_outputs
    if fmt is not None and so is not None and not _is_text(fmt):
        raise ApiError(
            400, "Give response_format or structured_outputs, not both", param="structured_outputs"
        )
    if not _is_text(fmt):
        return format_constraint(fmt)
    return None if so is None else _structured_outputs(so)


def format_constraint(fmt: ResponseFormat | None) -> Constraint | None:
    """A response_format (or any route's format of the same three kinds) -> its grammar."""
    if isinstance(fmt, JsonObjectFormat):
        return JsonObject()
    if isinstance(fmt, JsonSchemaFormat):
        schema = fmt.json_schema.json_schema
        return JsonObject() if schema is None else json_schema(schema)
    return None


def _is_text(fmt: Any) -> bool:
    return not isinstance(fmt, JsonObjectFormat | JsonSchemaFormat)


def _structured_outputs(so: Any) -> Constraint:
    given: list[Constraint] = []
    if so.json_spec is not None:
        if isinstance(so.json_spec, str):
            given.append(_schema_text(so.json_spec))
        else:
            given.append(json_schema(so.json_spec))
    if so.regex is not None:
        given.append(Regex(so.regex))
    if so.choice is not None:
        given.append(Choice(tuple(so.choice)))
    if so.grammar is not None:
        given.append(Grammar(so.grammar))
    if so.json_object:
        given.append(JsonObject())
    if len(given) != 1:
        raise ApiError(
            400,
            "structured_outputs takes exactly one of json, regex, choice, grammar, json_object",
            param="structured_outputs",
        )
    return given[0]


def _schema_text(text: str) -> Constraint:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(
            400, f"structured_outputs.json is not JSON: {exc}", param="structured_outputs.json"
        ) from exc
    if not isinstance(value, dict | bool):
        raise ApiError(400, "A JSON schema is an object", param="structured_outputs.json")
    return json_schema(value)
