"""The one chat-template renderer of the engine (its tokenizer: the offline LLM.chat), the
server's routes and the router (api/chat_template.py, api/router/tokenize.py): a model folder's
chat templates (the default, a `tool_use` variant where tokenizer_config has one, and radixcache's
ChatML hermes tool template for ChatML models whose own template cannot render tools), rendered in
the environment transformers' apply_chat_template gives a template. Same messages and tools -> the
same text, so the server and the router tokenize to the same ids and a second call with the same
tools hits the cache on the whole tools block. Torch-free, beside the KV-events wire format, since
the router never imports the engine (jinja2 only)."""

from __future__ import annotations

import importlib.resources
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERMES_TEMPLATE_FILE = "chatml_hermes_tools.jinja"
_MENTIONS_TOOLS = re.compile(r"\btools\b")
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


class NoChatTemplate(ValueError):
    """The model has no chat template (a base model)."""


class ToolsUnsupported(ValueError):
    """None of the model's templates can render tools or tool messages."""


@dataclass(frozen=True)
class ChatPrompt:
    """What a chat gives the template."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None  # OpenAI tool objects ({"type", "function"})
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # extra template variables

    @property
    def uses_tools(self) -> bool:
        return bool(self.tools) or any(
            m.get("role") == "tool" or m.get("tool_calls") for m in self.messages
        )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@cache
def compile_template(source: str) -> jinja2.Template:
    # the environment transformers' apply_chat_template gives a template (loopcontrols: {% break %})
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


@cache
def hermes_template() -> str:
    files = importlib.resources.files("radixcache.shared")
    return files.joinpath("templates", HERMES_TEMPLATE_FILE).read_text()


def can_render_tools(source: str) -> bool:
    return bool(_MENTIONS_TOOLS.search(source))


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _token_text(token: Any) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


@dataclass(frozen=True)
class ChatTemplates:
    default: str | None
    tool_use: str | None = None  # tokenizer_config's named `tool_use` variant
    special_tokens: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def from_folder(cls, folder: Path) -> ChatTemplates:
        """tokenizer_config.json's chat template(s) and special tokens, or chat_template.jinja."""
        folder = Path(folder)
        config = read_json(folder / "tokenizer_config.json")
        template = config.get("chat_template")
        tool_use = None
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            by_name = {t["name"]: t["template"] for t in template}
            template = by_name.get("default", next(iter(by_name.values()), None))
            tool_use = by_name.get("tool_use")
        jinja_file = folder / "chat_template.jinja"
        if template is None and jinja_file.exists():
            template = jinja_file.read_text()
        special = {n: _token_text(config.get(n)) for n in _SPECIAL_TOKENS}
        return cls(template, tool_use, special)

    def source_for(self, prompt: ChatPrompt) -> str:
        """The template to render `prompt` with: the default, or one that can render its tools."""
        if self.default is None:
            raise NoChatTemplate("This model has no chat template (a base model?)")
        if not prompt.uses_tools:
            return self.default
        for source in (self.tool_use, self.default):
            if source is not None and can_render_tools(source):
                return source
        if "<|im_start|>" in self.default:  # ChatML: radixcache's hermes tool template
            return hermes_template()
        raise ToolsUnsupported("This model's chat template cannot render tools or tool messages")

    def render(self, prompt: ChatPrompt, add_generation_prompt: bool = True) -> str:
        template = compile_template(self.source_for(prompt))
        variables = {**self.special_tokens, **prompt.template_kwargs}
        if prompt.tools:
            variables["tools"] = prompt.tools
        return template.render(
            messages=prompt.messages, add_generation_prompt=add_generation_prompt, **variables
        )
