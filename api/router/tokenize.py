"""The router's tokenizer: the model folder's tokenizer.json and chat template through
transformers (torch-free), rendering chat exactly as the replicas do (engine/loader/tokenizer.py:
the template gets the special tokens, the text is encoded without adding special tokens), the
rendered text tokenized stretch by stretch (segment_tokenizer.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from api.router.segment_tokenizer import SegmentTokenizer


class PromptTokenizer:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._tok = PreTrainedTokenizerFast(tokenizer_file=str(self.folder / "tokenizer.json"))
        config = _read_json(self.folder / "tokenizer_config.json")
        template = config.get("chat_template")
        if isinstance(template, list):
            by_name = {t["name"]: t["template"] for t in template}
            template = by_name.get("default", next(iter(by_name.values()), None))
        jinja = self.folder / "chat_template.jinja"
        if template is None and jinja.exists():
            template = jinja.read_text()
        self._template = template
        names = ("bos_token", "eos_token", "unk_token", "pad_token")
        self._special = {n: _text(config.get(n)) for n in names}
        # the replicas' own backend (engine/loader/tokenizer.py loads tokenizer.json the same way)
        self.segments = SegmentTokenizer(Tokenizer.from_file(str(self.folder / "tokenizer.json")))

    def chat(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.segments.encode(self.render(messages))

    def render(self, messages: list[dict[str, Any]]) -> str:
        if self._template is None:
            raise ValueError("this tokenizer has no chat template")
        return self._tok.apply_chat_template(
            messages,
            chat_template=self._template,
            add_generation_prompt=True,
            tokenize=False,
            **self._special,
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if add_special_tokens:  # what the post-processor adds is the backend's business
            return self.segments.backend.encode(text).ids
        return self.segments.encode(text)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _text(token: Any) -> str | None:
    return token.get("content") if isinstance(token, dict) else token
