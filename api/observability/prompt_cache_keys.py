"""Analytics per `prompt_cache_key`: the requests, prompt tokens and cached prompt tokens of each
key a client labels its requests with, for at most `max_keys` keys.

A key is a label, never a cache namespace. It is tenant data: each entry belongs to the scope of
the caller that sent it (its tenant's own cache salt, "" without a tenant) and is shown only to
callers who own that scope. When a new key would pass the bound, the least recently used entry is
folded into its scope's `other` counts."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from api.auth import Caller
from api.serving.job_streams import Finished
from engine.outputs import RequestResult

DEFAULT_MAX_KEYS = 64


@dataclass
class KeyCounts:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def add(self, other: KeyCounts) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens

    def report(self) -> dict[str, Any]:
        rate = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return {**vars(self), "hit_rate": round(rate, 6)}


@dataclass(frozen=True)
class KeyRow:
    label: str  # the key; prefixed by its scope when that is not the caller's own
    tenant: str | None
    counts: KeyCounts


@dataclass
class KeysView:
    """What one caller may see: its scopes' keys (busiest first), their folded keys' counts."""

    max_keys: int
    rows: list[KeyRow] = field(default_factory=list)
    other: KeyCounts = field(default_factory=KeyCounts)
    folded_keys: int = 0

    def report(self) -> dict[str, Any]:
        return {
            "max_keys": self.max_keys,
            "tracked_keys": len(self.rows),
            "folded_keys": self.folded_keys,
            "keys": {row.label: {**row.counts.report(), "tenant": row.tenant} for row in self.rows},
            "other": self.other.report(),
        }


class PromptCacheKeys:
    """Plain counters, updated on the event loop as requests finish; read by the stats routes and
    (`tracked`, `folded` only) the metrics collector."""

    def __init__(self, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, got {max_keys}")
        self.max_keys = max_keys
        self._keys: OrderedDict[tuple[str, str], KeyCounts] = OrderedDict()  # LRU first
        self._other: dict[str, KeyCounts] = {}  # scope -> counts of its folded keys
        self._folded: dict[str, int] = {}  # scope -> keys folded
        self._tenants: dict[str, str | None] = {}  # scope -> its tenant
        self.folded = 0  # keys folded, every scope (read by the metrics scrape, off the loop)

    @property
    def tracked(self) -> int:
        return len(self._keys)

    def record(self, caller: Caller, key: str, prompt_tokens: int, cached_tokens: int) -> None:
        scope = caller.cache_salt(None)
        self._tenants[scope] = caller.tenant
        entry = (scope, key)
        counts = self._keys.get(entry)
        if counts is None:
            counts = self._keys[entry] = KeyCounts()
            if len(self._keys) > self.max_keys:
                self._fold_oldest()
        self._keys.move_to_end(entry)
        counts.add(KeyCounts(1, prompt_tokens, cached_tokens))

    def recorder(self, caller: Caller, key: str | None) -> Finished | None:
        """What counts a request labelled `key` once all its jobs finished (None: no key)."""
        if key is None:
            return None

        def finished(results: list[RequestResult]) -> None:
            prompt = sum(len(r.prompt_token_ids) for r in results)
            cached = sum(r.num_cached_tokens for r in results)
            self.record(caller, key, prompt, cached)

        return finished

    def view(self, caller: Caller) -> KeysView:
        own = caller.cache_salt(None)
        view = KeysView(self.max_keys)
        for (scope, key), counts in self._keys.items():
            if caller.owns_salt(scope):
                label = key if scope == own else f"{scope}|{key}"
                view.rows.append(KeyRow(label, self._tenants[scope], counts))
        view.rows.sort(key=lambda row: (-row.counts.requests, row.label))
        for scope, counts in self._other.items():
            if caller.owns_salt(scope):
                view.other.add(counts)
                view.folded_keys += self._folded[scope]
        return view

    def _fold_oldest(self) -> None:
        (scope, _), counts = self._keys.popitem(last=False)
        self._other.setdefault(scope, KeyCounts()).add(counts)
        self._folded[scope] = self._folded.get(scope, 0) + 1
        self.folded += 1
