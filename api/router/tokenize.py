"""The router's tokenizer: the model folder's tokenizer.json and chat template through
transformers (torch-free), rendering chat exactly as the replicas do (engine/loader/tokenizer.py:
the template gets the special tokens, the text is encoded without adding special tokens)."""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast

_PIECES = 4096  # encoded text pieces kept (a system prompt is encoded once, then looked up)


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
        backend = self._tok.backend_tokenizer
        specials = {
            t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special
        }
        self._special_ids = specials
        alternation = "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True))
        self._split = re.compile(f"({alternation})") if specials else None
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()

    def chat(self, messages: list[dict[str, Any]]) -> list[int]:
        if self._template is None:
            raise ValueError("this tokenizer has no chat template")
        text = self._tok.apply_chat_template(
            messages,
            chat_template=self._template,
            add_generation_prompt=True,
            tokenize=False,
            **self._special,
        )
        return self.encode(text, add_special_tokens=False)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Special tokens split the text before BPE runs, so the pieces between them encode on
        their own; each piece's ids are cached (chat turns resend the same system prompt)."""
        if add_special_tokens or self._split is None:
            return list(self._tok.encode(text, add_special_tokens=add_special_tokens))
        ids: list[int] = []
        for piece in self._split.split(text):
            special = self._special_ids.get(piece)
            if special is not None:
                ids.append(special)
            elif piece:
                ids += self._piece(piece)
        return ids

    def _piece(self, text: str) -> list[int]:
        found = self._pieces.get(text)
        if found is None:
            found = self._tok.encode(text, add_special_tokens=False)
            self._pieces[text] = found
            if len(self._pieces) > _PIECES:
                self._pieces.popitem(last=False)
        else:
            self._pieces.move_to_end(text)
        return found


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _text(token: Any) -> str | None:
    return token.get("content") if isinstance(token, dict) else token
