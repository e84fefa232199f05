"""Incremental detokenization with stop strings.

Decodes a small window of tokens per step (never the whole output), waits while the window ends in
an incomplete UTF-8 sequence, and holds back streamed text that could be the start of a stop string."""

from __future__ import annotations

from typing import Protocol

_INCOMPLETE = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self, tokenizer: Decoder | None, stop: tuple[str, ...] = (), skip_special: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.skip_special = skip_special
        self.text = ""
        self.stopped = False  # a stop string was found; text is cut before it
        self._ids: list[int] = []
        self._prefix_offset = 0  # [prefix_offset, read_offset): context already in self.text
        self._read_offset = 0

    def append(self, token_id: int) -> bool:
        """Adds one generated token; returns True when a stop string has just completed."""
        if self.tokenizer is None or self.stopped:
            return False
        self._ids.append(token_id)
        window = self._ids[self._prefix_offset :]
        decode, skip = self.tokenizer.decode, self.skip_special
        prefix_text = decode(self._ids[self._prefix_offset : self._read_offset], skip)
        new_text = decode(window, skip)
        if len(new_text) <= len(prefix_text) or new_text.endswith(_INCOMPLETE):
            return False
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return self._add_text(delta)

    def _add_text(self, delta: str) -> bool:
        start = max(0, len(self.text) - max((len(s) for s in self.stop), default=0) + 1)
        self.text += delta
        if not self.stop:
            return False
        cut = min((i for i in (self.text.find(s, start) for s in self.stop) if i >= 0), default=-1)
        if cut < 0:
            return False
        self.text = self.text[:cut]
        self.stopped = True
        return True

    def visible_text(self, finished: bool) -> str:
        """Text safe to stream: while running, hold back a tail that may begin a stop string."""
        if finished or not self.stop:
            return self.text
        hold = max((_partial_suffix(self.text, s) for s in self.stop), default=0)
        return self.text[: len(self.text) - hold] if hold else self.text


def _partial_suffix(text: str, stop: str) -> int:
    # longest k < len(stop) with text ending in stop[:k]
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0
