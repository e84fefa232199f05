"""What a request's output must match: the specs the API builds and the engine compiles.

Torch-free, frozen and hashable, so a spec is its own compile-cache key. Build a JsonSchema from a
dict with `json_schema(...)` (or the text with `canonical_json`): compact separators, keys in the
order given. Property order is generation order (the grammar emits an object's properties in the
order its schema lists them: a tool call's "name" before its "arguments"), so keys are not sorted;
the same schema from the same caller still gives the same text, hence the same cache entry."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class ConstraintError(ValueError):
    """A bad or unsupported constraint; str(e) is a user-facing message (HTTP 400)."""


@dataclass(frozen=True)
class JsonSchema:
    schema: str  # the schema as canonical JSON text (canonical_json: compact, keys in order)


@dataclass(frozen=True)
class JsonObject:
    """Any JSON object (response_format json_object)."""


@dataclass(frozen=True)
class Regex:
    pattern: str


@dataclass(frozen=True)
class Choice:
    options: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tuple(self.options))


@dataclass(frozen=True)
class Grammar:
    text: str  # Lark or GBNF/EBNF text, as vLLM's structured_outputs.grammar


@dataclass(frozen=True)
class TaggedJson:
    """Tool calls: `begin` + one JSON value matching `schema` + `end`; repeated (joined by
    `separator`) when `repeat`; then the output ends (EOS forced)."""

    begin: str  # e.g. "<tool_call>\n"
    schema: str  # canonical JSON text, as JsonSchema.schema
    end: str  # e.g. "\n</tool_call>"
    repeat: bool = False
    separator: str = "\n"
    # JSON spelled as json.dumps does by default (", " and ": "), as chat templates render a call
    # they are given back (`tojson`): the next turn's prompt then repeats the generated tokens
    spaced: bool = False


Constraint = JsonSchema | JsonObject | Regex | Choice | Grammar | TaggedJson


def canonical_json(value: Any) -> str:
    """The one text form of a schema: compact separators, keys in the caller's order (see above)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def json_schema(schema: dict[str, Any] | bool) -> JsonSchema:
    return JsonSchema(canonical_json(schema))
