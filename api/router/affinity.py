"""prompt_cache_key -> the replica the router sent that key to last (bounded, least recently used
first out). A key groups requests that share a prefix, so keeping it on one replica keeps their
prefix in one cache; the policy decides whether that replica's load still allows it."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

DEFAULT_MAX_KEYS = 65_536

AffinityKey = tuple[str, str]  # (the caller's tenant, "" without one; the prompt_cache_key)


@dataclass
class AffinityCounts:
    learned: int = 0  # keys placed for the first time
    moved: int = 0  # keys sent to another replica than their home
    evicted: int = 0  # keys dropped to keep the bound
    forgotten: int = 0  # keys dropped because their replica left or failed


@dataclass
class KeyAffinity:
    max_keys: int = DEFAULT_MAX_KEYS
    counts: AffinityCounts = field(default_factory=AffinityCounts)
    _homes: OrderedDict[AffinityKey, str] = field(default_factory=OrderedDict)

    def home(self, key: AffinityKey) -> str | None:
        """The replica the key was sent to last, if the router still knows it."""
        return self._homes.get(key)

    def learn(self, key: AffinityKey, replica: str) -> None:
        """The key was just sent to `replica`: its home from now on."""
        before = self._homes.pop(key, None)
        if before is None:
            self.counts.learned += 1
        elif before != replica:
            self.counts.moved += 1
        self._homes[key] = replica
        if len(self._homes) > self.max_keys:
            self._homes.popitem(last=False)
            self.counts.evicted += 1

    def forget_replica(self, replica: str) -> None:
        """The replica left or stopped answering: its keys find a new home."""
        gone = [k for k, name in self._homes.items() if name == replica]
        for k in gone:
            del self._homes[k]
        self.counts.forgotten += len(gone)

    def stats(self) -> dict:
        return {"keys": len(self._homes), "max_keys": self.max_keys, **vars(self.counts)}
