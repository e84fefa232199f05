"""KV cache events in vLLM's wire format: what the engine publishes when its cached set changes."""

from engine.kv.events.config import KVEventsConfig
from engine.kv.events.publisher import PublisherStats, ZmqEventPublisher
from engine.kv.events.sink import KVEventSink

__all__ = ["KVEventSink", "KVEventsConfig", "PublisherStats", "ZmqEventPublisher"]
