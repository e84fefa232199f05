"""Tool calls out of generated text, one parser per format: hermes `<tool_call>` JSON (the
default), Llama 3 JSON, Mistral `[TOOL_CALLS]`, pythonic `[f(a=1)]` and Qwen3-Coder XML.

A parser says where the tool-call region of a text starts (`start`), how many trailing characters
may still become the start of one (`holdback`, so streamed content never shows half a marker), and
which calls a region holds (`parse`; `final=False` returns only calls already closed), and which a
region cut by the token limit holds (`cut`: the closed calls, then the open one with its name and
the arguments text as written so far, a JSON prefix; None when the region is no call in progress).
A region that does not parse is content: the model's text is returned as it is, never lost."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object as text


def _arguments(value: Any) -> str:
    if isinstance(value, str):  # some models write the arguments as a JSON string
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return value
    return json.dumps({} if value is None else value, ensure_ascii=False)


def _call_of(obj: Any) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return ParsedCall(obj["name"], _arguments(args))


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


# a call object's head, up to its arguments: {"name": "f", "arguments":
CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"arguments"\s*:\s*')


def _open_call(body: str, head: re.Match[str] | None) -> CallProgress | None:
    """A call cut by the token limit: its name and its arguments as written (the whole value
    when it is complete, else the prefix the model wrote); None before the name is complete."""
    if head is None:
        return None
    try:
        _, end = json.JSONDecoder().raw_decode(body, head.end())
    except json.JSONDecodeError:
        end = len(body)
    return CallProgress(head.group(1), body[head.end() : end], True)


def _calls_then_open(text: str, pos: int, separators: str) -> tuple[list[CallProgress], str]:
    """Whole JSON calls from `pos` on (joined by `separators`), then the open rest of the text."""
    decoder, calls = json.JSONDecoder(), []
    while True:
        while pos < len(text) and text[pos] in separators:
            pos += 1
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return calls, text[pos:]
        call = _call_of(obj)
        if call is None:  # a value that is no call ends the calls
            return calls, text[pos:]
        calls.append(CallProgress(call.name, call.arguments, True))
        pos = end


class MarkerParser:
    """Formats whose calls start at a marker anywhere in the text."""

    name = ""
    marker = ""

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self.tools = tools or []

    def start(self, text: str) -> int | None:
        found = text.find(self.marker)
        return None if found < 0 else found

    def holdback(self, text: str) -> int:
        return _partial_suffix(text, self.marker)

    def parse(self, region: str, final: bool) -> list[ParsedCall]:
        raise NotImplementedError

    def cut(self, region: str) -> list[CallProgress] | None:
        """Formats without a partial reading: a cut region stays content."""
        return None


@dataclass(frozen=True)
class CallProgress:
    """A call as far as it is written: its name, the arguments text safe to hand out so far (all
    of it, exactly as the model wrote it, once `closed`)."""

    name: str
    arguments: str
    closed: bool


class HermesParser(MarkerParser):
    """<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, streamed as it is written:
    the name once it is complete, then the arguments text (less a tail of `}` and blanks that
    may still close the call) as it grows."""

    name = "hermes"
    marker = "<tool_call>"
    _head = CALL_HEAD

    def parse(self, region: str, final: bool) -> list[ParsedCall]:
        return [ParsedCall(p.name, p.arguments) for p in self.progress(region, final) if p.closed]

    def progress(self, region: str, final: bool) -> list[CallProgress]:
        calls = []
        for part in region.split(self.marker)[1:]:
            closed = final or "</tool_call>" in part
            body = part.split("</tool_call>")[0]
            head = self._head.match(body)
            if not closed:
                if head is not None:  # an open call is the last one
                    tail = body[head.end() :]
                    tail = tail[: len(tail) - _partial_suffix(tail, "</tool_call>")]
                    calls.append(CallProgress(head.group(1), tail.rstrip("} \t\r\n"), False))
                break
            call = _closed_call(body, head)
            if call is not None:  # a body that is no call is dropped
                calls.append(call)
        return calls

    def cut(self, region: str) -> list[CallProgress]:
        calls = [p for p in self.progress(region, final=False) if p.closed]
        last = region.split(self.marker)[-1]
        if "</tool_call>" not in last:
            body = last[: len(last) - _partial_suffix(last, "</tool_call>")]
            call = _open_call(body, self._head.match(body))
            calls += [] if call is None else [call]
        return calls


def _closed_call(body: str, head: re.Match[str] | None) -> CallProgress | None:
    if head is not None:  # the arguments exactly as written
        try:
            _, end = json.JSONDecoder().raw_decode(body, head.end())
        except json.JSONDecodeError:
            return None
        return CallProgress(head.group(1), body[head.end() : end], True)
    try:  # another key order, or "parameters": read whole
        call = _call_of(json.loads(body))
    except json.JSONDecodeError:
        return None
    return None if call is None else CallProgress(call.name, call.arguments, True)


class Qwen3CoderParser(MarkerParser):
    """<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n
    </tool_call>; a value becomes JSON unless its parameter's schema type is string."""

    name = "qwen3_coder"
    marker = "<tool_call>"
    _call = re.compile(r"<tool_call>\s*<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
    _param = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)

    def _types(self, name: str) -> dict[str, Any]:
        for tool in self.tools:
            fn = tool.get("function", {})
            if fn.get("name") == name:
                return {
                    k: v.get("type")
                    for k, v in fn.get("parameters", {}).get("properties", {}).items()
                }
        return {}

    def parse(self, region: str, final: bool) -> list[ParsedCall]:
        calls = []
        for name, body in self._call.findall(region):
            types = self._types(name.strip())
            args: dict[str, Any] = {}
            for key, raw in self._param.findall(body):
                key = key.strip()
                if types.get(key) == "string":
                    args[key] = raw
                    continue
                try:
                    args[key] = json.loads(raw)
                except json.JSONDecodeError:
                    args[key] = raw
            calls.append(ParsedCall(name.strip(), json.dumps(args, ensure_ascii=False)))
        return calls


class MistralParser(MarkerParser):
    """[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] or [TOOL_CALLS]name[ARGS]{...}."""

    name = "mistral"
    marker = "[TOOL_CALLS]"
    _head = CALL_HEAD
    _args_form = re.compile(r"\s*([^\s\[]+)\[ARGS\]")

    def cut(self, region: str) -> list[CallProgress]:
        calls: list[CallProgress] = []
        for part in region.split(self.marker)[1:]:
            named = self._args_form.match(part)
            if named is not None:  # name[ARGS]{...}
                calls.append(_open_call(part, named) or CallProgress(named.group(1), "", True))
                continue
            opening = part.lstrip()
            if not opening.startswith("["):
                continue
            done, rest = _calls_then_open(opening, 1, " \t\r\n,")
            calls += done
            call = _open_call(rest, self._head.match(rest))
            calls += [] if call is None else [call]
        return calls

    def parse(self, region: str, final: bool) -> list[ParsedCall]:
        if not final:
            return []
        calls = []
        for part in region.split(self.marker)[1:]:
            part = part.strip()
            if "[ARGS]" in part and not part.startswith("["):
                name, _, args = part.partition("[ARGS]")
                try:
                    calls.append(ParsedCall(name.strip(), _arguments(json.loads(args))))
                except json.JSONDecodeError:
                    return []
                continue
            try:
                items = json.loads(part)
            except json.JSONDecodeError:
                return []
            for item in items if isinstance(items, list) else [items]:
                call = _call_of(item)
                if call is None:
                    return []
                calls.append(call)
        return calls


class LeadingParser:
    """Formats whose output is calls from its first character on (no marker inside text)."""

    name = ""
    openers: tuple[str, ...] = ()

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self.tools = tools or []

    def start(self, text: str) -> int | None:
        body = text.lstrip()
        if body and any(body.startswith(o) for o in self.openers):
            return len(text) - len(body)
        return None

    def holdback(self, text: str) -> int:
        body = text.lstrip()
        if not body or any(o.startswith(body) for o in self.openers):
            return len(text)  # may still become a call
        return 0

    def parse(self, region: str, final: bool) -> list[ParsedCall]:
        return self._parse(region.strip()) if final else []

    def _parse(self, text: str) -> list[ParsedCall]:
        raise NotImplementedError

    def cut(self, region: str) -> list[CallProgress] | None:
        """Formats without a partial reading: a cut region stays content."""
        return None


class Llama3JsonParser(LeadingParser):
    """{"name": ..., "parameters": {...}}, several joined by ';', maybe after <|python_tag|>."""

    name = "llama3_json"
    openers = ("{", "<|python_tag|>")
    _head = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"(?:parameters|arguments)"\s*:\s*')

    def cut(self, region: str) -> list[CallProgress] | None:
        text = region.strip()
        tagged = text.startswith("<|python_tag|>")
        text = text.removeprefix("<|python_tag|>")
        calls, rest = _calls_then_open(text, 0, " \t\r\n;")
        call = _open_call(rest, self._head.match(rest))
        if call is not None:
            return [*calls, call]
        compact = re.sub(r"\s", "", rest)
        if tagged or calls or compact.startswith('{"name":') or '{"name":'.startswith(compact):
            return calls  # a call whose name is not yet written
        return None  # JSON that is no call: content

    def _parse(self, text: str) -> list[ParsedCall]:
        text = text.removeprefix("<|python_tag|>")
        decoder, pos, calls = json.JSONDecoder(), 0, []
        while pos < len(text):
            while pos < len(text) and text[pos] in " \t\r\n;":
                pos += 1
            if pos == len(text):
                break
            try:
                obj, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                return []
            call = _call_of(obj)
            if call is None:
                return []
            calls.append(call)
        return calls


class PythonicParser(LeadingParser):
    """[get_weather(city="Paris"), get_time()] (Llama 3.2 / 4 pythonic)."""

    name = "pythonic"
    openers = ("[",)

    def _parse(self, text: str) -> list[ParsedCall]:
        try:
            tree = ast.parse(text, mode="eval").body
        except SyntaxError:
            return []
        if not isinstance(tree, ast.List):
            return []
        calls = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                return []
            try:
                args = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
            except ValueError:
                return []
            calls.append(ParsedCall(node.func.id, json.dumps(args, ensure_ascii=False)))
        return calls


ToolParser = MarkerParser | LeadingParser
PARSERS: dict[str, type[MarkerParser] | type[LeadingParser]] = {
    p.name: p
    for p in (HermesParser, Llama3JsonParser, MistralParser, PythonicParser, Qwen3CoderParser)
}


def format_of_template(source: str) -> str:
    """The tool-call format a chat template teaches its model (hermes when it says nothing)."""
    if "<function=" in source and "<tool_call>" in source:
        return "qwen3_coder"
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "func_name1(" in source or "[func_name" in source:
        return "pythonic"
    if "<|python_tag|>" in source or "ipython" in source:
        return "llama3_json"
    return "hermes"
