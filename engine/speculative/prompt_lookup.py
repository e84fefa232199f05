"""Prompt lookup: the request's own prompt and output as a draft source.

For each n-gram size, a dict from the n tokens before a position to the latest such position;
extended as tokens are appended (one dict write per size per token), so a lookup is O(1)."""

from __future__ import annotations

from array import array


class PromptLookup:
    def __init__(self, ngram_sizes: tuple[int, ...]) -> None:
        self.ngram_sizes = tuple(sorted(ngram_sizes, reverse=True))
        self._keys: list[dict[bytes, int]] = [{} for _ in self.ngram_sizes]
        self._indexed = 0  # positions [0, _indexed) have their n-grams (the tokens before) in

    def propose(self, tokens: array, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest n-gram
        ending `tokens` (the occurrence at the end itself has no continuation yet)."""
        self._extend(tokens)
        length = len(tokens)
        for n, keys in zip(self.ngram_sizes, self._keys, strict=True):
            if n >= length:
                continue
            pos = keys.get(tokens[length - n :].tobytes())
            if pos is not None:
                return list(tokens[pos : pos + k])
        return []

    def _extend(self, tokens: array) -> None:
        # position p is the token after tokens[p-n:p]; the last position gets no key (no
        # continuation), so a lookup never finds the n-gram it looks up with
        for p in range(max(self._indexed, 1), len(tokens)):
            for n, keys in zip(self.ngram_sizes, self._keys, strict=True):
                if p >= n:
                    keys[tokens[p - n : p].tobytes()] = p
        self._indexed = max(self._indexed, len(tokens))
