"""Constraint -> compiled grammar, through a thread-safe LRU cache keyed by the constraint.

The backend is llguidance: a constraint becomes llguidance grammar text (a JSON schema, a regex or
Lark, the tool-call tags in Lark around `%json{...}`), and compiling it builds an LLMatcher once
(lexer and parser tables); each sequence then starts from a deep copy of that matcher, which shares
the compiled tables. Compiles run on whichever thread asks (the API's worker threads through
AsyncEngine.prepare_constraints, the engine thread on a miss); concurrent asks for the same spec
compile it once. A JSON schema is closed and its numbers bounded first (json_schemas.py)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import llguidance as llg
from llguidance.gbnf_to_lark import gbnf_to_lark

from engine.structured.constraints import (
    Choice,
    Constraint,
    ConstraintError,
    Grammar,
    JsonObject,
    JsonSchema,
    Regex,
    TaggedJson,
)
from engine.structured.json_schemas import prepared

# a repeated TaggedJson (parallel tool calls) ends after this many: a small model, greedy, repeats
# its call until max_tokens otherwise, and the last one comes out cut (invalid)
MAX_TAGGED_REPEATS = 8

# compact separators, no free whitespace: a JSON output is never padded with "\n\n\n..."
JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ",",
    "key_separator": ":",
}
SPACED_JSON_OPTIONS: dict[str, Any] = {
    **JSON_OPTIONS,
    "item_separator": ", ",
    "key_separator": ": ",
}


@dataclass(frozen=True)
class CompiledGrammar:
    constraint: Constraint
    template: llg.LLMatcher  # never advanced: sequences start from deep copies


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar for a constraint (not yet validated)."""
    match constraint:
        case JsonSchema(schema):
            return llg.LLMatcher.grammar_from_json_schema(
                prepared(_load_schema(schema)), overrides=JSON_OPTIONS
            )
        case JsonObject():
            return llg.LLMatcher.grammar_from_json_schema(
                prepared({"type": "object"}), overrides=JSON_OPTIONS
            )
        case Regex(pattern):  # \d, \w, \s are ASCII (as users of these APIs expect)
            return llg.LLMatcher.grammar_from_lark(f"start: /{llg.regex_to_lark(pattern, 'dws')}/")
        case Choice(options):
            if not options:
                raise ConstraintError("a choice needs at least one option")
            return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(map(_lark_str, options)))
        case Grammar(text):
            lark = gbnf_to_lark(text) if "::=" in text else text
            return llg.LLMatcher.grammar_from_lark(lark)
        case TaggedJson():
            return llg.LLMatcher.grammar_from_lark(_tagged_lark(constraint))
    raise ConstraintError(f"unsupported constraint {type(constraint).__name__}")


def _load_schema(schema: str) -> Any:
    try:
        value = json.loads(schema)
    except json.JSONDecodeError as exc:
        raise ConstraintError(f"the JSON schema is not valid JSON: {exc}") from None
    if not isinstance(value, dict | bool):
        raise ConstraintError("a JSON schema must be an object or a boolean")
    return value


def _lark_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a Lark string literal: JSON escapes


def _tagged_lark(c: TaggedJson) -> str:
    schema = prepared(_load_schema(c.schema))
    if schema is False:
        schema = {"not": {}}
    options = SPACED_JSON_OPTIONS if c.spaced else JSON_OPTIONS
    schema = {**schema, "x-guidance": {**schema.get("x-guidance", {}), **options}}
    call = f"{_lark_str(c.begin)} value {_lark_str(c.end)}"
    more = f"({_lark_str(c.separator)} call){{0,{MAX_TAGGED_REPEATS - 1}}}"
    start = f"call {more}" if c.repeat else "call"
    return f"start: {start}\ncall: {call}\nvalue: %json {json.dumps(schema)}\n"


class GrammarCompiler:
    """The compile cache: at most `capacity` compiled grammars, least recently used out first."""

    def __init__(
        self,
        tokenizer_json: str | Callable[[], str],  # tokenizer.json's text, or how to get it
        vocab_size: int,
        eos_token_ids: list[int],
        capacity: int = 256,
    ) -> None:
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.capacity = capacity
        self._lock = threading.Lock()
        self._tokenizer: llg.LLTokenizer | None = None
        self._entries: OrderedDict[Constraint, Future[CompiledGrammar]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def tokenizer(self) -> llg.LLTokenizer:
        with self._lock:  # built once (~0.2 s for 49k tokens), on first use
            if self._tokenizer is None:
                text = self._tokenizer_json
                self._tokenizer = llg.LLTokenizer(
                    text if isinstance(text, str) else text(),
                    n_vocab=self.vocab_size,
                    eos_token=self.eos_token_ids,
                )
            return self._tokenizer

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """The compiled grammar (cached); ConstraintError for a bad or unsupported one."""
        with self._lock:
            future = self._entries.get(constraint)
            owner = future is None
            if owner:
                self.misses += 1
                future = self._entries[constraint] = Future()
                while len(self._entries) > self.capacity:
                    self._entries.popitem(last=False)
            else:
                self.hits += 1
                self._entries.move_to_end(constraint)
        if owner:
            try:
                future.set_result(self._build(constraint))
            except Exception as exc:
                with self._lock:
                    self._entries.pop(constraint, None)  # errors are not cached
                future.set_exception(exc)
        return future.result()

    def _build(self, constraint: Constraint) -> CompiledGrammar:
        tokenizer = self.tokenizer
        try:
            text = grammar_text(constraint)
        except ConstraintError:
            raise
        except Exception as exc:  # the converters raise ValueError or a bare Exception
            raise ConstraintError(f"invalid {_kind(constraint)}: {exc}") from None
        matcher = llg.LLMatcher(tokenizer, text, log_level=0)
        if matcher.is_error():
            raise ConstraintError(f"invalid {_kind(constraint)}: {matcher.get_error()}")
        return CompiledGrammar(constraint, matcher)

    def __len__(self) -> int:
        return len(self._entries)


def _kind(constraint: Constraint) -> str:
    return {
        JsonSchema: "JSON schema",
        JsonObject: "JSON object",
        Regex: "regex",
        Choice: "choice",
        Grammar: "grammar",
        TaggedJson: "tool-call schema",
    }[type(constraint)]
