"""Tools and schemas the tool and structured-output tests share."""

from __future__ import annotations

from typing import Any

WEATHER_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "The time now, in UTC"},
    },
]

# schemas whose every valid value is short (bounded strings, arrays, integers): a 135M model's
# constrained output always ends inside a small max_tokens
SCHEMAS: dict[str, dict[str, Any]] = {
    "nested": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "where": {
                "type": "object",
                "properties": {"lat": {"type": "integer", "minimum": -90, "maximum": 90}},
                "required": ["lat"],
                "additionalProperties": False,
            },
        },
        "required": ["city", "where"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 8},
                "minItems": 1,
                "maxItems": 3,
            }
        },
        "required": ["tags"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"mood": {"enum": ["happy", "sad", "calm"]}, "ok": {"type": "boolean"}},
        "required": ["mood", "ok"],
        "additionalProperties": False,
    },
    "any_of": {
        "type": "object",
        "properties": {
            "value": {
                "anyOf": [
                    {"type": "integer", "minimum": 0, "maximum": 999},
                    {"type": "string", "maxLength": 6},
                ]
            }
        },
        "required": ["value"],
        "additionalProperties": False,
    },
}
