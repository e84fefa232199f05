"""load_tokenizer: tokenizer.json (HF `tokenizers`) + the chat template of tokenizer_config.json."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _token_text(token: Any) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def compile_chat_template(source: str) -> jinja2.Template:
    # the environment transformers' apply_chat_template gives a template (loopcontrols: {% break %})
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class Tokenizer:
    def __init__(
        self,
        backend: HFTokenizer,
        chat_template: str | None,
        special_tokens: dict[str, str | None],
        eos_token_ids: set[int],
    ) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.special_tokens = special_tokens
        self.eos_token_ids = eos_token_ids
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self._template = compile_chat_template(chat_template) if chat_template else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def render_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        if self._template is None:
            raise ValueError("this tokenizer has no chat template")
        return self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens
        )

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        text = self.render_chat(messages, add_generation_prompt)
        return self.encode(text, add_special_tokens=False)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Tokenizer of an HF folder: tokenizer.json, tokenizer_config.json (chat template, special
    tokens; or chat_template.jinja), eos ids from tokenizer_config, config and generation_config."""
    path = Path(path)
    backend = HFTokenizer.from_file(str(path / "tokenizer.json"))
    tok_config = _read_json(path / "tokenizer_config.json")
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        by_name = {t["name"]: t["template"] for t in template}
        template = by_name.get("default", next(iter(by_name.values()), None))
    jinja_file = path / "chat_template.jinja"
    if template is None and jinja_file.exists():
        template = jinja_file.read_text()
    names = ("bos_token", "eos_token", "unk_token", "pad_token")
    special = {name: _token_text(tok_config.get(name)) for name in names}
    eos: set[int] = set()
    eos_text = special["eos_token"]
    if eos_text is not None and backend.token_to_id(eos_text) is not None:
        eos.add(backend.token_to_id(eos_text))
    for name in ("config.json", "generation_config.json"):
        eos.update(_ids(_read_json(path / name).get("eos_token_id")))
    return Tokenizer(backend, template, special, eos)
