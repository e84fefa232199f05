"""ZmqEventPublisher: one background thread owns a PUB socket (live batches) and an optional ROUTER
socket (replays of buffered batches from a sequence number), as vLLM's publisher does.

Callers only `offer` events: a non-blocking put into a bounded queue; when it is full the event
is dropped and counted (the engine loop never waits for the network). The thread drains what is
queued into one EventBatch per wake-up, numbers it (0, 1, 2, ...) and keeps it for replay.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import msgspec
import zmq

from engine.kv.events.config import KVEventsConfig
from radixcache.shared.kv_events_wire import END_SEQ_FRAME, EventBatch, KVCacheEvent, seq_frame

log = logging.getLogger(__name__)
_WAKE_S = 0.02  # longest wait for new events before the replay socket is polled again
_MAX_BATCH = 1024  # events per batch


@dataclass
class PublisherStats:
    offered: int = 0  # events handed to offer()
    dropped: int = 0  # events dropped because the queue was full
    batches: int = 0  # batches published
    replays: int = 0  # replay requests served


class ZmqEventPublisher:
    def __init__(self, config: KVEventsConfig, data_parallel_rank: int = 0) -> None:
        self.config = config
        self.stats = PublisherStats()
        self._rank = data_parallel_rank
        self._topic = config.topic.encode()
        self._queue: queue.Queue[KVCacheEvent] = queue.Queue(config.max_queue_events)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_batches)
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self.endpoint = _bind(self._pub, config.endpoint)
        self._replay = None
        self.replay_endpoint = None
        if config.replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self.replay_endpoint = _bind(self._replay, config.replay_endpoint)
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="kv-events", daemon=True)
        self._thread.start()

    def offer(self, event: KVCacheEvent) -> None:
        """Queues one event; never blocks (a full queue drops it and counts the drop)."""
        self.stats.offered += 1
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.stats.dropped += 1

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """True once every queued event has been published (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)  # polling interval
        return not self._queue.unfinished_tasks

    def close(self, timeout_s: float = 2.0) -> None:
        self.wait_idle(timeout_s)
        self._running = False
        self._thread.join(timeout_s)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()

    # --- publisher thread ---
    def _loop(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        seq = 0
        while self._running:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            events = self._drain()
            if not events:
                continue
            payload = encoder.encode(EventBatch(time.time(), events, self._rank))
            seq_bytes = seq_frame(seq)
            try:
                self._pub.send_multipart((self._topic, seq_bytes, payload), copy=False)
            except zmq.ZMQError:
                log.exception("publishing KV events failed")
            self._buffer.append((seq, payload))
            self.stats.batches += 1
            seq += 1
            for _ in events:
                self._queue.task_done()

    def _drain(self) -> list[KVCacheEvent]:
        try:
            events = [self._queue.get(timeout=_WAKE_S)]
        except queue.Empty:
            return []
        while len(events) < _MAX_BATCH:
            try:
                events.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return events

    def _serve_replay(self) -> None:
        """A request is (client id, b"", start seq as 8-byte big-endian); every buffered batch
        from that seq goes back as (client id, b"", topic, seq, payload), then END_SEQ_FRAME."""
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("ignoring a malformed replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        self.stats.replays += 1
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", self._topic, seq_frame(seq), payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ_FRAME, b""))


def _bind(sock: zmq.Socket, endpoint: str) -> str:
    """Binds `endpoint` (a tcp port of 0 takes a free port); returns the address bound."""
    sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)
