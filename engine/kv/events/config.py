"""Where and how a replica publishes its KV events (a frozen value, part of EngineConfig)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVEventsConfig:
    endpoint: str  # PUB socket, bound: tcp://127.0.0.1:5557 (port 0: any free port)
    replay_endpoint: str | None = None  # ROUTER socket replaying buffered batches
    topic: str = "kv-events"
    buffer_batches: int = 10_000  # batches kept for replay
    max_queue_events: int = 100_000  # events waiting for the publisher; beyond: dropped, counted
    hwm: int = 100_000  # ZMQ high-water mark of the PUB socket

    def __post_init__(self) -> None:
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"kv events {name} must be a ZMQ address (tcp://HOST:PORT)")
        if self.buffer_batches <= 0 or self.max_queue_events <= 0:
            raise ValueError("kv events buffer_batches and max_queue_events must be positive")
