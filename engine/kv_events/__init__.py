"""KV cache events in vLLM's wire format: what the engine publishes when its cached set changes."""

from engine.kv_events.config import KVEventsConfig
from engine.kv_events.publisher import PublisherStats, ZmqEventPublisher
from engine.kv_events.sink import KVEventSink

__all__ = ["KVEventSink", "KVEventsConfig", "PublisherStats", "ZmqEventPublisher"]
