"""Constrained decoding on the default model (its real 49,152-token tokenizer): JSON outputs validate
against their schemas (nested objects, arrays, enums, anyOf, required), greedy and seeded random;
regex and choice outputs match; tool calls come out as begin tag, one valid JSON call, end tag."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest

from engine.llm import LLM
from engine.sampling_params import SamplingParams
from engine.structured.constraints import Choice, JsonObject, Regex, TaggedJson, json_schema

SCHEMAS: dict[str, dict[str, Any]] = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 20},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                },
                "required": ["name", "age"],
            }
        },
        "required": ["user"],
    },
    "array": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"type": "string", "maxLength": 12},
                "minItems": 1,
                "maxItems": 3,
            }
        },
        "required": ["items"],
    },
    "enum": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
        },
        "required": ["color", "size"],
    },
    "anyOf": {
        "type": "object",
        "properties": {
            "value": {"anyOf": [{"type": "integer", "maximum": 999}, {"type": "boolean"}]},
            "note": {"type": "string", "maxLength": 16},
        },
        "required": ["value"],
    },
    "required": {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "count": {"type": "integer", "minimum": 0, "maximum": 50},
            "label": {"type": "string", "maxLength": 10},
        },
        "required": ["ok", "count"],
    },
}
WEATHER = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
    "required": ["name", "arguments"],
}


@pytest.fixture(scope="module")
def llm(default_model_path) -> LLM:
    llm = LLM(str(default_model_path), dtype="float32", num_blocks=512, seed=0)
    yield llm
    llm.engine.close()


def chat(llm: LLM, text: str) -> list[int]:
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": text}])


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0.0}, {"temperature": 0.8, "top_p": 0.95, "seed": 3}],
    ids=["greedy", "seeded"],
)
def test_json_outputs_validate_against_their_schemas(llm, sampling):
    prompt = chat(llm, "Answer with a JSON object.")
    params = [
        SamplingParams(max_tokens=120, constraint=json_schema(schema), **sampling)
        for schema in SCHEMAS.values()
    ]
    results = llm.generate([prompt] * len(SCHEMAS), params)
    for (name, schema), result in zip(SCHEMAS.items(), results, strict=True):
        out = result.outputs[0]
        assert out.finish_reason == "stop", (name, out.text)
        jsonschema.validate(json.loads(out.text), schema)  # raises on an invalid output
        assert "\n" not in out.text and ", " not in out.text  # compact, no whitespace runs
    assert (
        llm.engine.kv.cache.num_free_blocks() + llm.engine.kv.cache.num_evictable_blocks()
        == llm.engine.kv.cache.num_blocks
    )


def test_json_object_regex_and_choice(llm):
    prompt = chat(llm, "What is the phone number? Say yes or no, or give JSON.")
    pattern = r"\(\d{3}\) \d{3}-\d{4}"
    params = [
        SamplingParams(temperature=0.0, max_tokens=200, constraint=JsonObject()),
        SamplingParams(temperature=0.0, max_tokens=30, constraint=Regex(pattern)),
        SamplingParams(temperature=0.0, max_tokens=10, constraint=Choice(("yes", "no"))),
    ]
    obj, phone, choice = (r.outputs[0] for r in llm.generate([prompt] * 3, params))
    if obj.finish_reason == "stop":
        assert isinstance(json.loads(obj.text), dict)
    else:
        assert obj.text.startswith("{") and len(obj.token_ids) == 200
    assert re.fullmatch(pattern, phone.text) and phone.finish_reason == "stop"
    assert choice.text in ("yes", "no") and choice.finish_reason == "stop"


def test_a_tool_call_is_tagged_json(llm):
    prompt = chat(llm, "What is the weather in Paris? Call the get_weather tool.")
    begin, end = "<tool_call>\n", "\n</tool_call>"
    tagged = TaggedJson(begin, json_schema(WEATHER).schema, end)
    params = [
        SamplingParams(temperature=0.0, max_tokens=150, constraint=tagged),
        SamplingParams(n=3, temperature=0.9, seed=11, max_tokens=150, constraint=tagged),
    ]
    outs = [o for r in llm.generate([prompt] * 2, params) for o in r.outputs]
    assert len(outs) == 4
    for out in outs:
        assert out.finish_reason == "stop", out.text
        assert out.text.startswith(begin) and out.text.endswith(end), out.text
        value = json.loads(out.text.removeprefix(begin).removesuffix(end))
        jsonschema.validate(value, WEATHER)
        assert list(value) == ["name", "arguments"]  # the schema's order: name first
