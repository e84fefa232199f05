"""The replicas behind the router: where they are, what the router knows of them, what it counted."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from api.router.index import ReplicaIndex
from api.router.subscriber import EventSubscriber


@dataclass(frozen=True)
class ReplicaSpec:
    url: str  # http://HOST:PORT
    events: str | None = None  # tcp://HOST:PORT of its KV-events PUB socket
    replay: str | None = None  # tcp://HOST:PORT of its replay (ROUTER) socket

    @classmethod
    def parse(cls, text: str) -> ReplicaSpec:
        """'http://h:8001' or 'http://h:8001,tcp://h:5557[,tcp://h:5558]'."""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts or not parts[0].startswith(("http://", "https://")) or len(parts) > 3:
            raise ValueError(
                f"--replica wants http://HOST:PORT[,tcp://HOST:EVENTPORT[,tcp://HOST:REPLAYPORT]], got {text!r}"
            )
        if any(not p.startswith("tcp://") for p in parts[1:]):
            raise ValueError(f"--replica event endpoints must be tcp:// addresses, got {text!r}")
        return cls(parts[0].rstrip("/"), *parts[1:])


@dataclass
class Replica:
    name: str
    spec: ReplicaSpec
    index: ReplicaIndex
    lock: threading.Lock = field(default_factory=threading.Lock)
    subscriber: EventSubscriber | None = None
    healthy: bool = True
    discovered: bool = False  # found by --replicas-dns (dropped when its address goes)
    load: int = 0  # requests in flight through the router
    requests: int = 0
    failures: int = 0  # requests that failed on this replica (connect, 5xx, mid-stream)
    predicted_cached_tokens: int = 0
    reported_cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens
    prompt_tokens: int = 0  # usage.prompt_tokens
    decisions: Counter[str] = field(default_factory=Counter)

    @property
    def exact(self) -> bool:
        """True when the index follows the replica's own events (not the router's guesses)."""
        return self.subscriber is not None

    def match(self, tokens: Sequence[int]) -> int:
        with self.lock:
            return self.index.match(tokens)

    def sent(self, tokens: Sequence[int]) -> None:
        with self.lock:
            self.index.sent(tokens)

    def stats(self) -> dict:
        out = {
            "url": self.spec.url,
            "events": self.spec.events,
            "healthy": self.healthy,
            "load": self.load,
            "requests": self.requests,
            "failures": self.failures,
            "predicted_cached_tokens": self.predicted_cached_tokens,
            "reported_cached_tokens": self.reported_cached_tokens,
            "prompt_tokens": self.prompt_tokens,
            "decisions": dict(self.decisions),
            "index_blocks": self.index.num_blocks(),
            "index": vars(self.index.counts),
        }
        if self.subscriber is not None:
            sub = self.subscriber
            out["subscriber"] = {
                **vars(sub.counts),
                **vars(sub.decoder.counts),
                "next_seq": sub.next_seq,
            }
        return out


def build_replica(name: str, spec: ReplicaSpec, capacity_blocks: int, block_size: int) -> Replica:
    """A replica and its index; with events, a subscriber (not started) that feeds the index."""
    index = ReplicaIndex(capacity_blocks, block_size, exact=spec.events is not None)
    r = Replica(name, spec, index)
    if spec.events is not None:
        r.subscriber = EventSubscriber(r.name, spec.events, spec.replay, r.index, r.lock)
    return r


def build_replicas(
    specs: list[ReplicaSpec], capacity_blocks: int, block_size: int
) -> list[Replica]:
    """The --replica list, named r0, r1, ... in its order."""
    return [build_replica(f"r{i}", s, capacity_blocks, block_size) for i, s in enumerate(specs)]
