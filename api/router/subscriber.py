"""EventSubscriber: one thread per replica reading its KV events into its ReplicaIndex.

On connect it asks the replay socket for every batch from seq 0; after a gap in sequence
numbers it asks for the missing ones; when the seq goes backwards (the replica restarted) it
clears the index and replays from 0. Without a replay socket a gap is only counted. Bad payloads
and unknown events are counted and skipped (radixcache.shared.kv_events_wire)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import xxhash
import zmq
from msgspec import UNSET

from api.router.index import ReplicaIndex
from radixcache.shared.kv_events_wire import (
    END_SEQ,
    PRIMARY_MEDIA,
    AllBlocksCleared,
    BatchDecoder,
    BlockRemoved,
    BlockStored,
    seq_of,
)

log = logging.getLogger("radixcache.router")
_POLL_MS = 50
_REPLAY_TIMEOUT_S = 2.0
_RECENT = 4096  # batches remembered to tell a replayed copy from a restarted publisher


@dataclass
class SubscriberCounts:
    batches: int = 0
    events: int = 0
    lower_tier_events: int = 0  # events of the replica's host/disk/redis tiers (not indexed)
    window_group_events: int = 0  # about a hybrid model's sliding-window blocks (not indexed)
    gaps: int = 0
    restarts: int = 0
    replays: int = 0
    replayed_batches: int = 0
    duplicates: int = 0  # batches already applied (live and replayed copies overlap)


class EventSubscriber:
    def __init__(
        self,
        name: str,
        endpoint: str,
        replay_endpoint: str | None,
        index: ReplicaIndex,
        lock: threading.Lock,
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.index = index
        self.lock = lock  # guards `index` (the router's event loop matches against it)
        self.decoder = BatchDecoder()
        self.counts = SubscriberCounts()
        self.window_groups: set[int] = set()  # KV-cache groups learnt to be sliding-window
        self.next_seq: int | None = None  # the seq expected next; None before the first batch
        self._recent: dict[int, int] = {}  # seq -> digest of the payload applied
        self._ctx = zmq.Context()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"events-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._ctx.term()

    # --- thread ---
    def _run(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(self.endpoint)
        try:
            self._replay(0)
            while not self._stop.is_set():
                if sub.poll(_POLL_MS):
                    self._on_message(sub.recv_multipart())
        except Exception:  # never take the router down; the health check still routes around
            log.exception("event subscriber %s stopped", self.name)
        finally:
            sub.close()

    def _on_message(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or (seq := seq_of(frames[1])) is None:
            self.decoder.counts.bad_payloads += 1
            return
        expected, payload = self.next_seq, frames[2]
        if expected is not None and seq < expected and not self._seen(seq, payload):
            self._restarted()
        elif expected is not None and seq > expected:
            self.counts.gaps += 1
            self._replay(expected)
        self._apply(seq, payload)

    def _seen(self, seq: int, payload: bytes) -> bool:
        return self._recent.get(seq) == xxhash.xxh3_64_intdigest(payload)

    def _restarted(self) -> None:
        """The seq went back to a batch we never saw: a new publisher. Start over from 0."""
        self.counts.restarts += 1
        with self.lock:
            self.index.cleared()
        self.next_seq = None
        self._recent.clear()
        self._replay(0)

    def _apply(self, seq: int, payload: bytes) -> None:
        if self.next_seq is not None and seq < self.next_seq:
            self.counts.duplicates += 1
            return
        self.next_seq = seq + 1
        self._recent[seq] = xxhash.xxh3_64_intdigest(payload)
        self._recent.pop(seq - _RECENT, None)
        events = self.decoder.decode(payload)
        if events is None:
            return
        self.counts.batches += 1
        with self.lock:
            for event in events:
                self._apply_event(event)

    def _apply_event(self, event: object) -> None:
        self.counts.events += 1
        if isinstance(event, AllBlocksCleared):
            self.index.cleared()
        elif event.medium not in PRIMARY_MEDIA:  # type: ignore[attr-defined]
            self.counts.lower_tier_events += 1
        elif self._windowed_group(event):
            self.counts.window_group_events += 1
        elif isinstance(event, BlockStored):
            self.index.stored(
                event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size
            )
        elif isinstance(event, BlockRemoved):
            self.index.removed(event.block_hashes)

    def _windowed_group(self, event: BlockStored | BlockRemoved) -> bool:
        """An event about a hybrid model's sliding-window layers' blocks: the index follows
        the full-attention group only (a hit there is what a prompt can reuse; the replica cuts
        it to where its windowed blocks are). A group is learnt windowed from its BlockStored."""
        group = event.group_idx
        if group is UNSET or group is None:
            return False
        kind = getattr(event, "kv_cache_spec_kind", UNSET)
        if kind not in (UNSET, None, "full_attention"):
            self.window_groups.add(group)
        return group in self.window_groups

    def _replay(self, start: int) -> None:
        """Applies every buffered batch from `start` (a DEALER talking to the ROUTER socket)."""
        if self.replay_endpoint is None:
            return
        self.counts.replays += 1
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.replay_endpoint)
        try:
            sock.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + _REPLAY_TIMEOUT_S
            while time.monotonic() < deadline and not self._stop.is_set():
                if not sock.poll(_POLL_MS):
                    continue
                frames = sock.recv_multipart()
                if len(frames) != 4 or (seq := seq_of(frames[2])) is None or seq == END_SEQ:
                    return
                self.counts.replayed_batches += 1
                self._apply(seq, frames[3])
                deadline = time.monotonic() + _REPLAY_TIMEOUT_S
        finally:
            sock.close()
