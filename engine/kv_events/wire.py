"""vLLM's KV-events wire format (vllm/distributed/kv_events.py), field for field, so consumers of
vLLM's events (Dynamo, llm-d, our router) read ours.

A message is multipart (topic, seq as 8-byte big-endian, payload); the payload is a msgpack
EventBatch encoded as an array [ts, events, data_parallel_rank]; each event is a map tagged
{"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared", ...} with defaults omitted.
Block hashes are our chained 64-bit xxh3 hashes (vLLM allows int or bytes).
"""

from __future__ import annotations

from typing import Any

import msgspec

# vLLM names the primary KV pool "GPU" and host memory "CPU"; the tiers below get their own names
MEDIUM = {"device": "GPU", "host": "CPU", "disk": "DISK", "redis": "REDIS"}


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged events (tag = class name, in the field "type")."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(EventBatch):
    events: list[KVEvent]


END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay socket's end-of-replay marker
