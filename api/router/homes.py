"""Where the router sent something last: a key (a prompt_cache_key, a stored response's id) ->
the replica's name, bounded (the least recently used out first) and forgetting a replica that
left or failed. affinity.py and conversations.py each keep one."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K")
DEFAULT_MAX_HOMES = 65_536


@dataclass
class HomeCounts:
    learned: int = 0  # keys placed for the first time
    moved: int = 0  # keys sent to another replica than their home
    evicted: int = 0  # keys dropped to keep the bound
    forgotten: int = 0  # keys dropped: their replica left, failed, or said the key is not its


@dataclass
class ReplicaHomes(Generic[K]):
    max_entries: int = DEFAULT_MAX_HOMES
    label: str = "keys"  # what the stats call the entries
    counts: HomeCounts = field(default_factory=HomeCounts)
    _homes: OrderedDict[K, str] = field(default_factory=OrderedDict)

    def home(self, key: K) -> str | None:
        """The replica the key was sent to last, if the router still knows it."""
        name = self._homes.get(key)
        if name is not None:
            self._homes.move_to_end(key)
        return name

    def learn(self, key: K, replica: str) -> None:
        """The key was just sent to (or answered by) `replica`: its home from now on."""
        before = self._homes.pop(key, None)
        if before is None:
            self.counts.learned += 1
        elif before != replica:
            self.counts.moved += 1
        self._homes[key] = replica
        if len(self._homes) > self.max_entries:
            self._homes.popitem(last=False)
            self.counts.evicted += 1

    def forget(self, key: K) -> None:
        if self._homes.pop(key, None) is not None:
            self.counts.forgotten += 1

    def forget_replica(self, replica: str) -> None:
        """The replica left or stopped answering: its keys find a new home."""
        gone = [k for k, name in self._homes.items() if name == replica]
        for k in gone:
            del self._homes[k]
        self.counts.forgotten += len(gone)

    def stats(self) -> dict:
        return {
            self.label: len(self._homes),
            f"max_{self.label}": self.max_entries,
            **vars(self.counts),
        }
