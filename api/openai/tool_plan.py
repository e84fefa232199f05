"""A request's tools in the engine's terms: tool_choice -> a ToolPlan (which parser reads calls
out of the text, and for `required` / a named function the TaggedJson grammar that forces them).
Protocol-neutral: each route maps its tools onto OpenAI's function `Tool` and its choice onto
`ToolChoice` (e.g. Anthropic's `any` is `required`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.chat_template import ChatTemplates, TemplateError
from api.errors import ApiError
from api.openai.protocol_tools import NamedToolChoice, Tool, ToolChoice
from api.openai.tool_parsers import (
    PARSERS,
    HermesParser,
    Llama3JsonParser,
    MistralParser,
    ToolParser,
    format_of_template,
)
from engine.structured.constraints import TaggedJson, canonical_json
from radixcache.shared.chat_template import ChatPrompt

NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
# formats whose markers are special tokens in their models' vocabularies: kept in the text
SPECIAL = frozenset({"mistral", "llama3_json"})


@dataclass(frozen=True)
class ToolPlan:
    parser: ToolParser | None  # None: no calls are parsed (tool_choice none)
    constraint: TaggedJson | None  # required / named: the calls the output must be
    parallel: bool  # more than one call allowed

    @property
    def forced(self) -> bool:
        return self.constraint is not None

    @property
    def keeps_special_tokens(self) -> bool:
        """The call markers are special tokens: the text keeps them for the parser."""
        return self.parser is not None and self.parser.name in SPECIAL


def tool_format(configured: str | None, templates: ChatTemplates, prompt: ChatPrompt) -> str:
    """The tool-call format: --tool-call-parser's, else the one the chat template teaches."""
    if configured is not None:
        return configured
    try:
        return format_of_template(templates.source_for(prompt))
    except TemplateError as exc:
        raise ApiError(400, str(exc), param=exc.param) from exc


def plan_tools(
    tools: list[Tool] | None,
    choice: ToolChoice | None,
    parallel_calls: bool,
    configured: str | None,
    templates: ChatTemplates,
    prompt: ChatPrompt,
) -> ToolPlan | None:
    """Every route's tool plan: in the format the calls are written in (`tool_format`: the
    server's --tool-call-parser, else the prompt's template's), hermes when there are no tools."""
    fmt = tool_format(configured, templates, prompt) if tools else "hermes"
    return tool_plan(tools, choice, parallel_calls, fmt)


def tool_plan(
    tools: list[Tool] | None, choice: ToolChoice | None, parallel_calls: bool, fmt: str
) -> ToolPlan | None:
    """None without tools; `fmt` is the tool-call format (the template's or --tool-call-parser),
    `parallel_calls`: more than one call allowed (parallel_tool_calls)."""
    if not tools:
        if choice is not None and choice != "none":
            raise ApiError(400, "tool_choice needs tools: no tools were given", param="tool_choice")
        return None
    if len({t.function.name for t in tools}) != len(tools):
        raise ApiError(400, "Two tools have the same name", param="tools")
    tool_dicts = [t.model_dump(exclude_none=True) for t in tools]
    if choice == "none":
        return ToolPlan(None, None, False)
    if choice is None or choice == "auto":
        return ToolPlan(PARSERS[fmt](tool_dicts), None, parallel_calls)
    functions = [t.function for t in tools]
    if isinstance(choice, NamedToolChoice):
        functions = [f for f in functions if f.name == choice.function.name]
        if not functions:
            raise ApiError(
                400,
                f"tool_choice names the function {choice.function.name!r}, which is not in tools",
                param="tool_choice",
            )
    parallel = parallel_calls and not isinstance(choice, NamedToolChoice)
    schemas = [_call_schema(f.name, f.parameters, fmt) for f in functions]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    parser, constraint = _forced(fmt, schema, parallel, tool_dicts)
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
    # spelled as the hermes template renders a call it is given back (`tojson`)
    tagged = TaggedJson(
        "<tool_call>\n", canonical_json(schema), "\n</tool_call>", parallel, "\n", spaced=True
    )
    return HermesParser(tools), tagged
