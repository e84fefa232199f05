"""The rewrites a JSON schema gets before llguidance compiles it: objects closed, numbers bounded.

Bounded numbers keep a constrained output from running on with digits until max_tokens. Wherever a
schema lets a number appear (a number or integer type, a schema that says nothing of its type, the
values of an open object or array, `true`):
- an integer lies in [-INTEGER_LIMIT, INTEGER_LIMIT]: at most int64's 19 digits, plus a sign
  (INTEGER_LIMIT is 2**63 - 1024, the largest double below 2**63: llguidance reads bounds as
  doubles);
- a number has the same bounded integer part and at most FRACTION_DIGITS fraction digits (a
  `multipleOf` of 1e-10, the finest step llguidance takes exactly), and no exponent (llguidance
  writes a bounded number as a plain decimal).
A schema's own bounds still apply: a tighter minimum or maximum is kept, a wider one is clamped,
its own multipleOf replaces the fraction bound; const and enum values are left as they are."""

from __future__ import annotations

from typing import Any

INTEGER_LIMIT = 2**63 - 1024
FRACTION_DIGITS = 10
ANY_VALUE = "bounded_json_value"  # the $defs entry every open value refers to
_ANY_REF = {"$ref": f"#/$defs/{ANY_VALUE}"}

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LITERALS = ("const", "enum", "default", "examples", "required")
_ONE_SUBSCHEMA = ("items", "additionalProperties", "additionalItems", "contains")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_COMPOUND = ("const", "enum", "$ref", "anyOf", "oneOf", "allOf", "not")


def prepared(schema: Any) -> Any:
    """The schema as it is compiled: closed, then its numbers bounded."""
    return bounded(closed(schema))


def closed(schema: Any) -> Any:
    """`additionalProperties: false` on every object schema that lists properties and says
    nothing of others (xgrammar's strict mode, vLLM's default): a listed object ends after its
    properties instead of running on with invented keys. Outputs stay valid for the schema."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: closed(s) for name, s in value.items()}
        elif key in _LITERALS:
            out[key] = value
        else:
            out[key] = closed(value)
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def bounded(schema: Any) -> Any:
    """The schema with every number it allows bounded (see the module's docstring)."""
    if schema is False:
        return schema
    walker = _Bounder()
    out = walker.node({} if schema is True else schema)
    if walker.any_used:
        defs = dict(out.get("$defs", {}))
        defs[ANY_VALUE] = _any_value()
        out = {**out, "$defs": defs}
    return out


def _any_value() -> dict[str, Any]:
    """Any JSON value, its numbers bounded, its arrays and objects holding the same."""
    return {
        **_number_bounds({}, integer=False),
        "items": _ANY_REF,
        "additionalProperties": _ANY_REF,
    }


def _number_bounds(schema: dict[str, Any], integer: bool) -> dict[str, Any]:
    bounds: dict[str, Any] = {}
    low, high = schema.get("minimum"), schema.get("maximum")
    if not isinstance(low, int | float) or low < -INTEGER_LIMIT:
        bounds["minimum"] = -INTEGER_LIMIT
    if not isinstance(high, int | float) or high > INTEGER_LIMIT:
        bounds["maximum"] = INTEGER_LIMIT
    if not integer and "multipleOf" not in schema:
        bounds["multipleOf"] = float(f"1e-{FRACTION_DIGITS}")
    return bounds


class _Bounder:
    def __init__(self) -> None:
        self.any_used = False

    def sub(self, schema: Any) -> Any:
        """A subschema position: `true` (any value) becomes the bounded any value."""
        if schema is True:
            self.any_used = True
            return _ANY_REF
        return self.node(schema) if isinstance(schema, dict) else schema

    def node(self, schema: dict[str, Any]) -> dict[str, Any]:
        out = dict(schema)
        for key, value in schema.items():
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {name: self.sub(s) for name, s in value.items()}
            elif key in _ONE_SUBSCHEMA:
                out[key] = (
                    [self.sub(s) for s in value] if isinstance(value, list) else self.sub(value)
                )
            elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
                out[key] = [self.sub(s) for s in value]
        if any(key in schema for key in _COMPOUND):
            return out  # finite values, or bounded in the schemas it refers to
        types = schema.get("type")
        allowed = {types} if isinstance(types, str) else set(types or ())
        anything = not allowed
        if anything or allowed & {"number", "integer"}:
            integer = not anything and "number" not in allowed
            out.update(_number_bounds(schema, integer))
        if (anything or "object" in allowed) and "additionalProperties" not in schema:
            out["additionalProperties"] = self.sub(True)
        if (anything or "array" in allowed) and "items" not in schema:
            out["items"] = self.sub(True)
        return out
