"""A request's output constraints, in the engine's terms: response_format and vLLM's
structured_outputs -> one Constraint; tool_choice -> a ToolPlan (which parser reads calls out of
the text, and for `required` / a named function the TaggedJson grammar that forces them);
logit_bias -> (token id, bias) pairs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from api.errors import ApiError
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from api.openai.protocol_tools import JsonObjectFormat, JsonSchemaFormat, NamedToolChoice
from api.openai.tool_parsers import (
    PARSERS,
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    ToolParser,
)
from engine.structured.constraints import (
    Choice,
    Constraint,
    Grammar,
    JsonObject,
    Regex,
    TaggedJson,
    canonical_json,
    json_schema,
)

NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def output_constraint(req: CompletionRequest | ChatCompletionRequest) -> Constraint | None:
    fmt, so = req.response_format, req.structured_outputs
    if fmt is not None and so is not None and not _is_text(fmt):
        raise ApiError(
            400, "Give response_format or structured_outputs, not both", param="structured_outputs"
        )
    if isinstance(fmt, JsonObjectFormat):
        return JsonObject()
    if isinstance(fmt, JsonSchemaFormat):
        schema = fmt.json_schema.json_schema
        return JsonObject() if schema is None else json_schema(schema)
    return None if so is None else _structured_outputs(so)


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


def logit_bias_of(
    req: CompletionRequest | ChatCompletionRequest, vocab_size: int
) -> tuple[tuple[int, float], ...]:
    pairs = []
    for key, bias in (req.logit_bias or {}).items():
        if not (key.isascii() and key.isdigit()) or int(key) >= vocab_size:
            raise ApiError(
                400,
                f"logit_bias key {key!r} is not a token id in [0, {vocab_size})",
                param="logit_bias",
            )
        pairs.append((int(key), bias))
    return tuple(pairs)


# ---------------------------------------------------------------- tools


@dataclass(frozen=True)
class ToolPlan:
    parser: ToolParser | None  # None: no calls are parsed (tool_choice none)
    constraint: TaggedJson | None  # required / named: the calls the output must be
    parallel: bool  # more than one call allowed

    @property
    def forced(self) -> bool:
        return self.constraint is not None


def tool_plan(req: ChatCompletionRequest, fmt: str) -> ToolPlan | None:
    """None without tools; `fmt` is the tool-call format (the template's or --tool-call-parser)."""
    choice = req.tool_choice
    if not req.tools:
        if choice is not None and choice != "none":
            raise ApiError(400, "tool_choice needs tools: no tools were given", param="tool_choice")
        return None
    if len({t.function.name for t in req.tools}) != len(req.tools):
        raise ApiError(400, "Two tools have the same name", param="tools")
    tools = [t.model_dump(exclude_none=True) for t in req.tools]
    if choice == "none":
        return ToolPlan(None, None, False)
    if choice is None or choice == "auto":
        return ToolPlan(PARSERS[fmt](tools), None, req.parallel_tool_calls)
    functions = [t.function for t in req.tools]
    if isinstance(choice, NamedToolChoice):
        functions = [f for f in functions if f.name == choice.function.name]
        if not functions:
            raise ApiError(
                400,
                f"tool_choice names the function {choice.function.name!r}, which is not in tools",
                param="tool_choice",
            )
    parallel = req.parallel_tool_calls and not isinstance(choice, NamedToolChoice)
    schemas = [_call_schema(f.name, f.parameters, fmt) for f in functions]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    parser, constraint = _forced(fmt, schema, parallel, tools)
    return ToolPlan(parser, constraint, parallel)


def _call_schema(name: str, parameters: dict[str, Any] | None, fmt: str) -> dict[str, Any]:
    key = "parameters" if fmt == "llama3_json" else "arguments"
    params = parameters if parameters and parameters.get("properties", True) else NO_PARAMETERS
    if params.get("type") == "object" and not params.get("properties"):
        params = NO_PARAMETERS  # a parameterless tool: `{}` only (no endless free object)
    return {
        "type": "object",
        "properties": {"name": {"const": name}, key: params},
        "required": ["name", key],
        "additionalProperties": False,
    }


def _forced(
    fmt: str, schema: dict[str, Any], parallel: bool, tools: list[dict[str, Any]]
) -> tuple[ToolParser, TaggedJson]:
    """The grammar of forced calls in the format's own tags. Formats without a JSON form
    (pythonic, Qwen3-Coder XML) are forced as hermes <tool_call> JSON and read back as such."""
    if fmt == "llama3_json":
        return Llama3JsonParser(tools), TaggedJson("", canonical_json(schema), "", parallel, "; ")
    if fmt == "mistral":
        array = {"type": "array", "items": schema, "minItems": 1}
        if not parallel:
            array["maxItems"] = 1
        return MistralParser(tools), TaggedJson("[TOOL_CALLS]", canonical_json(array), "")
    tagged = TaggedJson("<tool_call>\n", canonical_json(schema), "\n</tool_call>", parallel, "\n")
    return HermesParser(tools), tagged
