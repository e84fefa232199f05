"""Bounded numbers in the JSON grammars (engine/structured/json_schemas.py): the compiled grammar
refuses an integer past int64's digits, a fraction past FRACTION_DIGITS and an exponent wherever a
schema lets a number appear, keeps a schema's own bounds, and a forced call whose model would run
on digits ends with a bounded number in valid JSON (the tiny byte-level model, logit_bias)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from engine.sampling_params import SamplingParams
from engine.structured.compiler import GrammarCompiler
from engine.structured.constraints import Constraint, JsonObject, TaggedJson, json_schema
from engine.structured.json_schemas import FRACTION_DIGITS, INTEGER_LIMIT
from tests.tiny_models import EOS_ID

DIGITS_25 = "1" * 25
ORDER = {
    "type": "object",
    "properties": {"order_id": {"type": "integer"}, "total": {"type": "number"}},
    "required": ["order_id", "total"],
}


@pytest.fixture(scope="module")
def grammars(tiny_llama) -> GrammarCompiler:
    return GrammarCompiler((tiny_llama / "tokenizer.json").read_text(), 320, [EOS_ID])


def accepts(grammars: GrammarCompiler, constraint: Constraint, text: str) -> bool:
    """The whole text is a complete output of the grammar."""
    matcher = grammars.compile(constraint).template.deep_copy()
    ok = matcher.consume_tokens(grammars.tokenizer.tokenize_str(text))
    return ok and matcher.is_accepting()


@pytest.mark.parametrize(
    ("schema", "template"),
    [
        ({"type": "integer"}, "{}"),
        ({"type": "number"}, "{}"),
        ({"type": ["integer", "null"]}, "{}"),
        ({}, "{}"),  # any value
        ({"type": "object"}, '{{"k":{}}}'),  # an open object's values
        ({"type": "array"}, "[1,[{}]]"),  # an open array's items
        (ORDER, '{{"order_id":{},"total":1.5}}'),
    ],
    ids=["integer", "number", "nullable", "any", "open-object", "open-array", "properties"],
)
def test_integers_stop_at_int64_s_digits(grammars, schema: dict, template: str) -> None:
    constraint = json_schema(schema)
    for ok in ("0", "-42", str(10**18), str(-(10**18)), "9" * 18):
        assert accepts(grammars, constraint, template.format(ok)), ok
    assert not accepts(grammars, constraint, template.format(DIGITS_25))
    assert not accepts(grammars, constraint, template.format("9" * 20))


def test_fractions_are_bounded_and_exponents_refused(grammars) -> None:
    for constraint in (json_schema({"type": "number"}), JsonObject()):
        wrap = (lambda v: v) if constraint != JsonObject() else (lambda v: f'{{"x":{v}}}')
        assert accepts(grammars, constraint, wrap("3." + "1" * FRACTION_DIGITS))
        assert accepts(grammars, constraint, wrap("-0.5"))
        assert not accepts(grammars, constraint, wrap("3." + "1" * (FRACTION_DIGITS + 1)))
        assert not accepts(grammars, constraint, wrap("1.0" + "0" * 30))
        assert not accepts(grammars, constraint, wrap("1e999"))


def test_a_schema_s_own_bounds_still_apply(grammars) -> None:
    small = json_schema({"type": "integer", "minimum": 3, "maximum": 50})
    assert accepts(grammars, small, "50") and not accepts(grammars, small, "51")
    assert not accepts(grammars, small, "2")
    wide = json_schema({"type": "integer", "maximum": 1e30})  # clamped to int64's digits
    assert accepts(grammars, wide, str(INTEGER_LIMIT)) and not accepts(grammars, wide, DIGITS_25)
    halves = json_schema({"type": "number", "multipleOf": 0.5})
    assert accepts(grammars, halves, "2.5") and not accepts(grammars, halves, "2.25")
    assert not accepts(grammars, halves, DIGITS_25)


def test_a_forced_call_pushed_to_digits_ends_with_a_bounded_number(make_llm) -> None:
    llm = make_llm(num_blocks=256)
    call = {
        "type": "object",
        "properties": {"name": {"const": "lookup_order"}, "arguments": ORDER},
        "required": ["name", "arguments"],
    }
    tagged = TaggedJson("<tool_call>\n", json_schema(call).schema, "\n</tool_call>")
    (digit,) = llm.tokenizer.encode("1", add_special_tokens=False)
    params = SamplingParams(
        temperature=0.0, max_tokens=200, constraint=tagged, logit_bias=((digit, 100.0),)
    )
    out = llm.generate([[10, 20, 30, 40]], params)[0].outputs[0]
    assert out.finish_reason == "stop", out.text
    body = out.text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")
    value: dict[str, Any] = json.loads(body)
    jsonschema.validate(value, call)
    args = value["arguments"]
    assert args["order_id"] == int("1" * 19)  # as many digits as int64 has, then the call ends
    whole, _, fraction = body.split('"total":')[1].rstrip("}").partition(".")
    assert len(whole.lstrip("-")) <= 19 and len(fraction) <= FRACTION_DIGITS
