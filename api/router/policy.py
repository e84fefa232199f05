"""Which replica gets a request: cache-aware (the home of its prompt_cache_key while that replica
is not overloaded, else the longest cached prefix unless load is imbalanced, after SGLang's
router), round-robin, or least-loaded."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from api.router.replicas import Replica

POLICIES = ("cache-aware", "round-robin", "least-loaded")


@dataclass(frozen=True)
class Balance:
    abs_threshold: int = 32  # imbalanced when max load - min load exceeds this ...
    rel_threshold: float = 1.5  # ... and max load > rel_threshold * min load
    cache_threshold: float = 0.2  # a match shorter than this share of the prompt is a miss

    def overloaded(self, load: int, lowest: int) -> bool:
        """Whether a replica with `load` in flight is too far above the least loaded one."""
        return load - lowest > self.abs_threshold and load > self.rel_threshold * lowest


class Decision(NamedTuple):
    replica: Replica
    reason: str  # key_affinity | cache_hit | cache_miss | imbalance | round_robin | least_loaded
    predicted_tokens: int


class Router:
    def __init__(self, policy: str, balance: Balance) -> None:
        if policy not in POLICIES:
            raise ValueError(f"--policy must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        self.balance = balance
        self._turn = itertools.count()

    def choose(
        self, candidates: list[Replica], tokens: Sequence[int], home: Replica | None = None
    ) -> Decision:
        """`home`: where the request's prompt_cache_key went last (one of `candidates`), if any;
        only the cache-aware policy follows it."""
        if self.policy == "round-robin":
            r = candidates[next(self._turn) % len(candidates)]
            return Decision(r, "round_robin", r.match(tokens))
        if self.policy == "least-loaded":
            r = _least_loaded(candidates)
            return Decision(r, "least_loaded", r.match(tokens))
        return self._cache_aware(candidates, tokens, home)

    def _cache_aware(
        self, candidates: list[Replica], tokens: Sequence[int], home: Replica | None
    ) -> Decision:
        b = self.balance
        loads = [r.load for r in candidates]
        lo, hi = min(loads), max(loads)
        if home is not None and not b.overloaded(home.load, lo):
            return Decision(home, "key_affinity", home.match(tokens))
        matches = [r.match(tokens) for r in candidates]
        if b.overloaded(hi, lo):
            i = loads.index(lo)
            return Decision(candidates[i], "imbalance", matches[i])
        best = max(range(len(candidates)), key=lambda i: (matches[i], -loads[i]))
        if tokens and matches[best] >= b.cache_threshold * len(tokens):
            return Decision(candidates[best], "cache_hit", matches[best])
        i = min(range(len(candidates)), key=lambda i: (loads[i], candidates[i].index.num_blocks()))
        return Decision(candidates[i], "cache_miss", matches[i])


def _least_loaded(candidates: list[Replica]) -> Replica:
    return min(candidates, key=lambda r: r.load)
