"""Reading vLLM's KV-events format (what vLLM and `radixcache serve` publish), leniently: fields a
newer publisher adds are ignored, an event with an unknown tag is counted and skipped, a payload
that is not an EventBatch is counted and dropped. Multipart message: (topic, seq, payload)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

END_SEQ = -1  # the replay socket's end-of-replay marker (as a signed 8-byte big-endian seq)


class RawBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


class BlockStored(msgspec.Struct, tag=True):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None = None
    token_ids: list[int] = []
    block_size: int = 0
    medium: str | None = None


class BlockRemoved(msgspec.Struct, tag=True):
    block_hashes: list[int | bytes]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True):
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared
PRIMARY_MEDIA = (None, "GPU")  # the replica's own KV pool (vLLM and radixcache both say "GPU")


@dataclass
class DecodeCounts:
    bad_payloads: int = 0  # not msgpack, or not an EventBatch
    bad_events: int = 0  # unknown tag or malformed fields


class BatchDecoder:
    def __init__(self) -> None:
        self._batch = msgspec.msgpack.Decoder(RawBatch)
        self._event = msgspec.msgpack.Decoder(Event)
        self.counts = DecodeCounts()

    def decode(self, payload: bytes) -> list[Any] | None:
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


def seq_of(frame: bytes) -> int | None:
    return int.from_bytes(frame, "big", signed=True) if len(frame) == 8 else None
