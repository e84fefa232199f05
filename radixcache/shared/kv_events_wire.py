"""vLLM's KV-events wire format (vllm/distributed/kv_events.py), field for field: the engine's
publisher encodes it, the router decodes it (ours and vLLM's), one copy of the classes for both.

A message is multipart (topic, seq as 8-byte big-endian, payload); the payload is a msgpack
EventBatch encoded as an array [ts, events, data_parallel_rank]; each event is a map tagged
{"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared", ...}. Block hashes are our chained
64-bit xxh3 hashes (vLLM allows int or bytes).

Encoding writes what vLLM writes: every field vLLM declares without a default (even when None),
none of its optional trailing fields (they are UNSET here, and UNSET is never written). Decoding
is lenient: those fields have defaults, so an older publisher that omits one still decodes; fields
a newer publisher adds are ignored; an event with an unknown tag is counted and skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from radixcache.shared.tier_names import TierName

# vLLM names the primary KV pool "GPU" and host memory "CPU"; the tiers below get their own names
MEDIUM = {
    TierName.DEVICE: "GPU",
    TierName.HOST: "CPU",
    TierName.DISK: "DISK",
    TierName.REDIS: "REDIS",
}
PRIMARY_MEDIA = (None, "GPU")  # a replica's own KV pool (vLLM and radixcache both say "GPU")
END_SEQ = -1  # the replay socket's end-of-replay marker


def seq_frame(seq: int) -> bytes:
    """A message's seq frame: 8 bytes, big-endian, signed."""
    return seq.to_bytes(8, "big", signed=True)


def seq_of(frame: bytes) -> int | None:
    return int.from_bytes(frame, "big", signed=True) if len(frame) == 8 else None


END_SEQ_FRAME = seq_frame(END_SEQ)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=False, gc=False, tag=True):
    """Base of the tagged events (tag = class name, in the field "type")."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None | UnsetType = UNSET
    group_idx: int | None | UnsetType = UNSET
    kv_cache_spec_kind: str | None | UnsetType = UNSET
    kv_cache_spec_sliding_window: int | None | UnsetType = UNSET
    locality: str | None | UnsetType = UNSET
    ownership: str | None | UnsetType = UNSET
    session_id: str | None | UnsetType = UNSET


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None = None
    group_idx: int | None | UnsetType = UNSET
    locality: str | None | UnsetType = UNSET
    ownership: str | None | UnsetType = UNSET


class AllBlocksCleared(KVCacheEvent):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(EventBatch):
    events: list[KVEvent]


# --- lenient reading (the router) ---
class RawBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


@dataclass
class DecodeCounts:
    bad_payloads: int = 0  # not msgpack, or not an EventBatch
    bad_events: int = 0  # unknown tag or malformed fields


class BatchDecoder:
    def __init__(self) -> None:
        self._batch = msgspec.msgpack.Decoder(RawBatch)
        self._event = msgspec.msgpack.Decoder(KVEvent)
        self.counts = DecodeCounts()

    def decode(self, payload: bytes) -> list[KVEvent] | None:
        """The batch's events that decode (bad ones counted); None for a bad payload."""
        try:
            batch = self._batch.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.counts.bad_payloads += 1
            return None
        events = []
        for raw in batch.events:
            try:
                events.append(self._event.decode(raw))
            except (msgspec.DecodeError, msgspec.ValidationError):
                self.counts.bad_events += 1
        return events
