"""A turn's prompt token ids. The template renders the whole conversation (the earlier turns, then
the new input); where an earlier turn was stored, its own token ids (its prompt and what the model
generated) are reused for as much of the rendered text as they spell, and only the rest is
tokenized. Re-tokenizing the earlier output could split it differently from how the model
generated it, so the cache would miss from there on; reusing the ids keeps it hit."""

from __future__ import annotations

from typing import Any

from api.chat_template import ChatTemplates, TemplateError
from api.errors import ApiError
from radixcache.shared.chat_template import ChatPrompt


def prompt_ids(
    tokenizer: Any, templates: ChatTemplates, prompt: ChatPrompt, earlier: list[int]
) -> list[int]:
    """Blocking (run it off the event loop)."""
    try:
        text = templates.render(prompt)
    except TemplateError as exc:
        raise ApiError(400, str(exc), param="input") from exc
    known = next((i for i, t in enumerate(earlier) if t >= tokenizer.vocab_size), len(earlier))
    kept = spelled_prefix(tokenizer, earlier[:known], text)  # ids past the tokenizer's: not sent
    rest = text[len(tokenizer.decode(kept, skip_special_tokens=False)) :]
    ids = kept + (list(tokenizer.encode(rest, add_special_tokens=False)) if rest else [])
    if not ids:
        raise ApiError(400, "The input produces an empty prompt", param="input")
    return ids


def spelled_prefix(tokenizer: Any, ids: list[int], text: str) -> list[int]:
    """The longest prefix of `ids` whose text starts `text` (binary search: a prefix of a prefix
    spells a prefix, but for a cut inside a multi-byte character, which only shortens it)."""

    def spells(k: int) -> bool:
        return text.startswith(tokenizer.decode(ids[:k], skip_special_tokens=False))

    if spells(len(ids)):
        return list(ids)
    low, high = 0, len(ids)  # spells(low), not spells(high)
    while high - low > 1:
        mid = (low + high) // 2
        if spells(mid):
            low = mid
        else:
            high = mid
    return list(ids[:low])
