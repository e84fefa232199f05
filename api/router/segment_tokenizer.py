"""SegmentTokenizer: a tokenizer.json's plain `encode`, computed stretch by stretch.

HF `tokenizers` cut the input at its added tokens (those matched on the raw text) before it
normalizes, pre-tokenizes and runs the model, and it treats each stretch between them on its own;
so the ids of a text are the ids of its stretches and of the added tokens between them, in order.
A chat rendered by its template is such a text (`<|im_start|>user\\n...<|im_end|>\\n...`): each
stretch's ids are kept in a bounded LRU keyed by the stretch's text, so a system prompt or an
earlier turn is tokenized once and a conversation's next turn costs only its new messages.

A config that looks across the cut (an added token that strips whitespace or needs word
boundaries, Metaspace prepending only at offset 0, truncation, padding, dropout) is detected, and
probe texts confirm the rest; such a tokenizer is served by the plain encode."""

from __future__ import annotations

import json
import re
import threading
from array import array
from collections import OrderedDict
from typing import Any

from tokenizers import Tokenizer

MAX_STRETCHES = 8192
MAX_TOKENS = 2_000_000  # ids held in all (a bound on memory); a stretch over 1/8 is not kept


class SegmentTokenizer:
    def __init__(
        self, backend: Tokenizer, max_stretches: int = MAX_STRETCHES, max_tokens: int = MAX_TOKENS
    ) -> None:
        self.backend = backend
        self.max_stretches, self.max_tokens = max_stretches, max_tokens
        config = json.loads(backend.to_str())
        cuts = [t for t in config["added_tokens"] if not t["normalized"]]
        self._id = {t["content"]: t["id"] for t in cuts}
        names = sorted(self._id, key=len, reverse=True)  # leftmost-longest, as tokenizers matches
        self._cut = re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else None
        self._lock = threading.Lock()
        self._stretches: OrderedDict[str, list[int]] = OrderedDict()
        self._held = 0
        self.hits = self.misses = 0
        self.blockers = config_blockers(config, backend)
        if not self.blockers:
            bad = next((t for t in probe_texts(cuts) if not self._agrees(t)), None)
            if bad is not None:
                self.blockers = [f"probe {bad!r}: segmented ids differ from encode"]
        self.segmented = not self.blockers
        self.clear()

    def encode(self, text: str) -> list[int]:
        """== backend.encode(text, add_special_tokens=False).ids"""
        if not self.segmented:
            return self.backend.encode(text, add_special_tokens=False).ids
        return self._segmented(text).tolist()

    def encode_array(self, text: str) -> array:
        """encode(text) as array("q") (what the router's indexes take without a copy)."""
        if not self.segmented:
            return array("q", self.backend.encode(text, add_special_tokens=False).ids)
        return self._segmented(text)

    def split_known(self, text: str) -> tuple[array, str]:
        """The ids of text's leading stretches already held (and of the added tokens among them),
        and the text after them: `known + encode(tail) == encode(text)`. A conversation's next
        turn is known up to its last answer, so a router can route on it before tokenizing the rest."""
        if not self.segmented:
            return array("q"), text
        ids, used = self._walk(text, known_only=True)
        return ids, text[used:]

    def clear(self) -> None:
        with self._lock:
            self._stretches.clear()
            self._held = 0
            self.hits = self.misses = 0

    def stats(self) -> dict[str, Any]:
        return {
            "segmented": self.segmented,
            "fallback_reasons": self.blockers,
            "stretch_hits": self.hits,
            "stretch_misses": self.misses,
            "stretches_held": len(self._stretches),
            "tokens_held": self._held,
        }

    def _segmented(self, text: str) -> array:
        return self._walk(text, known_only=False)[0]

    def _walk(self, text: str, known_only: bool) -> tuple[array, int]:
        """The ids of text's pieces in order (odd pieces: added tokens) and the characters they
        cover; known_only stops at the first stretch not held instead of encoding it."""
        ids = array("q")
        used = 0  # the pieces partition the text
        for i, piece in enumerate(self._cut.split(text) if self._cut else [text]):
            if i % 2:
                ids.append(self._id[piece])
            elif piece:
                found = self._lookup(piece)
                if found is None:
                    if known_only:
                        break
                    found = self._encode_new(piece)
                ids += found
            used += len(piece)
        return ids, used

    def _lookup(self, text: str) -> array | None:
        with self._lock:
            found = self._stretches.get(text)
            if found is not None:
                self._stretches.move_to_end(text)
                self.hits += 1
            return found

    def _encode_new(self, text: str) -> array:
        """A stretch not held: encoded, counted as a miss and kept (unless it is too long)."""
        with self._lock:
            self.misses += 1
        found = array("q", self.backend.encode(text, add_special_tokens=False).ids)
        if len(found) <= self.max_tokens // 8:
            self._keep(text, found)
        return found

    def _keep(self, text: str, ids: array) -> None:
        with self._lock:
            if text in self._stretches:
                return
            self._stretches[text] = ids
            self._held += len(ids)
            while len(self._stretches) > self.max_stretches or self._held > self.max_tokens:
                self._held -= len(self._stretches.popitem(last=False)[1])

    def _agrees(self, text: str) -> bool:
        return (
            self._segmented(text).tolist()
            == self.backend.encode(text, add_special_tokens=False).ids
        )


def config_blockers(config: dict[str, Any], backend: Tokenizer) -> list[str]:
    """Why cutting at the added tokens would change the ids (empty: it would not)."""
    reasons = [f"{key} is set" for key in ("truncation", "padding") if config.get(key)]
    if config["model"].get("dropout"):
        reasons.append("the model has dropout")
    if getattr(backend, "encode_special_tokens", False):
        reasons.append("encode_special_tokens is set (special tokens are not cut)")
    for t in config["added_tokens"]:
        flags = [f for f in ("lstrip", "rstrip", "single_word") if t.get(f)]
        if flags and not t["normalized"]:
            reasons.append(f"added token {t['content']!r} has {'/'.join(flags)}")
    for step in _steps(config.get("pre_tokenizer")):
        if step.get("type") == "Metaspace" and step.get("prepend_scheme") == "first":
            reasons.append("Metaspace prepends only at the start of the text")
    if not any(not t["normalized"] for t in config["added_tokens"]):
        reasons.append("no added tokens to cut at")
    return reasons


def probe_texts(cuts: list[dict[str, Any]]) -> list[str]:
    """Texts where a cut meets whitespace, unicode, digits, another added token or its own
    prefix: one set per added token (the first 64)."""
    texts = [" ", "\n\n", "hello world 12345 ", " \u00e9t\u00e9 \u4e2d\u6587 \U0001f600\t"]
    for t in cuts[:64]:
        a = t["content"]
        texts += [a, f" {a} ", f"\n{a}\nx", f"x{a}{a}y", f"{a}  \u00fc 42{a[:-1]}", f"\t{a}\u00e9"]
    if len(cuts) > 1:
        a, b = cuts[0]["content"], cuts[1]["content"]
        texts.append(f"{a}system\nHi there.{b}\n{a}user\n  x {b}\n{a}assistant\n")
    return texts


def _steps(node: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not node:
        return []
    inner = node.get("pretokenizers")
    return [s for n in inner for s in _steps(n)] if inner else [node]
