"""A bounded per-namespace index of token runs (finished outputs, cached prompts) for drafting:
the last few tokens of a sequence -> what followed them the last time they were seen.

Token ids only, no KV: a draft from here costs nothing to keep and is checked by the model anyway.
Every namespace has its own key table, so a tenant's text never drafts for another's. The index
holds at most `max_tokens` tokens over all namespaces; the oldest run goes first.

Each token costs about two dict entries (one per n-gram size), so keys and hits are plain ints: an
n-gram's hash (a collision only costs a draft the model rejects) and the run id and position packed
in one int, about 100 bytes a key instead of 200 for bytes keys and tuple hits."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixcache.hashing import Namespace


@dataclass
class _Table:
    """One namespace's n-gram keys: hash of the n-gram -> the latest run and the position of the
    token after it there, packed as run_id << position_bits | position."""

    keys: dict[int, int] = field(default_factory=dict)


class SuffixIndex:
    def __init__(self, max_tokens: int = 1 << 18, ngram_sizes: tuple[int, ...] = (4, 3, 2)):
        if max_tokens <= 0 or not ngram_sizes or min(ngram_sizes) < 1:
            raise ValueError("max_tokens and the n-gram sizes must be positive")
        self.max_tokens = max_tokens
        self._position_bits = max_tokens.bit_length()
        self._position_mask = (1 << self._position_bits) - 1
        self.ngram_sizes = tuple(sorted(set(ngram_sizes), reverse=True))  # longest tried first
        self._runs: OrderedDict[int, tuple[Namespace, array]] = OrderedDict()  # oldest first
        self._tables: dict[Namespace, _Table] = {}
        self._next_id = 0
        self.num_tokens = 0

    def __len__(self) -> int:
        return len(self._runs)

    def num_keys(self) -> int:
        """N-gram keys held over all namespaces (about two a token: its memory)."""
        return sum(len(table.keys) for table in self._tables.values())

    def add(self, ns: Namespace, tokens: Sequence[int] | array) -> None:
        """Indexes a run of tokens of `ns` (its n-grams now point here); evicts the oldest runs
        past the bound. A run longer than the bound keeps its last `max_tokens` tokens."""
        run = array("q", tokens[-self.max_tokens :])
        if len(run) <= min(self.ngram_sizes):
            return
        run_id, self._next_id = self._next_id, self._next_id + 1
        self._runs[run_id] = (ns, run)
        self.num_tokens += len(run)
        keys = self._tables.setdefault(ns, _Table()).keys
        packed = run_id << self._position_bits
        for n in self.ngram_sizes:
            for end in range(n, len(run)):  # the n-gram run[end-n:end] is followed by run[end]
                keys[hash(run[end - n : end].tobytes())] = packed | end
        while self.num_tokens > self.max_tokens:
            self._evict_oldest()

    def propose(self, ns: Namespace, context: Sequence[int] | array, k: int) -> list[int]:
        """Up to k tokens that followed the longest n-gram ending `context`, in `ns` only."""
        table = self._tables.get(ns)
        if table is None or k <= 0:
            return []
        tail = array("q", context[-self.ngram_sizes[0] :])
        for n in self.ngram_sizes:
            if n > len(tail):
                continue
            hit = table.keys.get(hash(tail[len(tail) - n :].tobytes()))
            if hit is not None:
                run_id, pos = hit >> self._position_bits, hit & self._position_mask
                return list(self._runs[run_id][1][pos : pos + k])
        return []

    def _evict_oldest(self) -> None:
        run_id, (ns, run) = self._runs.popitem(last=False)
        self.num_tokens -= len(run)
        table = self._tables[ns]
        packed = run_id << self._position_bits
        for n in self.ngram_sizes:
            for end in range(n, len(run)):
                key = hash(run[end - n : end].tobytes())
                if table.keys.get(key) == packed | end:
                    del table.keys[key]
        if not table.keys:
            del self._tables[ns]
