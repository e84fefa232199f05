"""load_tokenizer: tokenizer.json (HF `tokenizers`) + the model folder's chat templates, rendered
by radixcache's one renderer (radixcache/shared/chat_template.py, the server's and the router's too)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from radixcache.shared.chat_template import ChatPrompt, ChatTemplates, read_json


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


class Tokenizer:
    def __init__(
        self, backend: HFTokenizer, templates: ChatTemplates, eos_token_ids: set[int]
    ) -> None:
        self.backend = backend
        self.templates = templates
        self.eos_token_ids = eos_token_ids
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    @property
    def chat_template(self) -> str | None:
        return self.templates.default

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        return self.templates.render(ChatPrompt(messages, tools), add_generation_prompt)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        text = self.render_chat(messages, add_generation_prompt, tools)
        return self.encode(text, add_special_tokens=False)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Tokenizer of an HF folder: tokenizer.json, the chat templates and special tokens
    (ChatTemplates.from_folder), eos ids from tokenizer_config, config and generation_config."""
    path = Path(path)
    backend = HFTokenizer.from_file(str(path / "tokenizer.json"))
    templates = ChatTemplates.from_folder(path)
    eos: set[int] = set()
    eos_text = templates.special_tokens["eos_token"]
    if eos_text is not None and backend.token_to_id(eos_text) is not None:
        eos.add(backend.token_to_id(eos_text))
    for name in ("config.json", "generation_config.json"):
        eos.update(_ids(read_json(path / name).get("eos_token_id")))
    return Tokenizer(backend, templates, eos)
