"""KV events from a real engine: what the publisher sends (read back over real ZMQ sockets)
describes exactly the blocks that entered and left each tier, in vLLM's wire layout."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import pytest
import zmq

from engine.kv.admin import Flush
from engine.kv.events import KVEventsConfig, ZmqEventPublisher
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from radixcache.hashing import block_hashes
from radixcache.shared.kv_events_wire import (
    END_SEQ_FRAME,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from storage.config import TierConfig

LOOPBACK = "tcp://127.0.0.1:0"
BS = 4  # TINY_ENGINE's block size


def events_config(**kw) -> KVEventsConfig:
    return KVEventsConfig(LOOPBACK, LOOPBACK, **kw)


def replay(publisher: ZmqEventPublisher, start: int = 0) -> list[tuple[int, bytes, bytes]]:
    """Every buffered (seq, topic, payload) from `start`, through the replay socket."""
    assert publisher.wait_idle()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(publisher.replay_endpoint)
    sock.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    try:
        while True:
            assert sock.poll(5000), "replay timed out"
            _, topic, seq, payload = sock.recv_multipart()
            if seq == END_SEQ_FRAME:
                return out
            out.append((int.from_bytes(seq, "big"), topic, payload))
    finally:
        sock.close(linger=0)
        ctx.term()


def events_of(publisher: ZmqEventPublisher) -> list:
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    return [e for _, _, payload in replay(publisher) for e in decoder.decode(payload).events]


def live_hashes(events: list, medium: str) -> dict[int, list[int]]:
    """Replays the events: block hash -> token ids (empty for lower tiers) still held in `medium`."""
    held: dict[int, list[int]] = {}
    for e in events:
        if isinstance(e, AllBlocksCleared):
            held.clear()
        elif e.medium != medium:
            continue
        elif isinstance(e, BlockStored):
            for i, h in enumerate(e.block_hashes):
                held[h] = e.token_ids[i * e.block_size : (i + 1) * e.block_size]
        else:
            for h in e.block_hashes:
                held.pop(h, None)
    return held


def greedy(n: int = 3) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def test_stored_events_carry_the_trees_chained_hashes(make_llm: Callable[..., LLM]) -> None:
    llm = make_llm(num_blocks=64, kv_events=events_config())
    prompt = list(range(10, 30))  # 5 full blocks
    llm.generate([prompt], greedy(1))
    llm.generate([prompt[:12] + [7] * 8], greedy(1))  # shares 3 blocks, adds 2
    events = events_of(llm.engine.kv.publisher)
    assert isinstance(events[0], AllBlocksCleared)  # a fresh pool: consumers start over
    first, second = events[1], events[2]
    ns = llm.engine.namespace
    expected = block_hashes(ns, prompt[:16])  # tokens[:-1] is matched; 4 blocks computed
    assert first.block_hashes[:4] == expected and first.parent_block_hash is None
    assert first.token_ids[:16] == prompt[:16] and first.block_size == BS
    assert first.medium == "GPU" and first.lora_id is None and first.lora_name is None
    # the second prompt's new blocks hang under the third shared block, with their own tokens
    assert second.parent_block_hash == expected[2]
    assert second.block_hashes[0] == block_hashes(ns, prompt[:12] + [7] * 4)[-1]
    assert second.token_ids[:4] == [7] * 4


def test_events_follow_evictions_and_match_the_tree(make_llm: Callable[..., LLM]) -> None:
    llm = make_llm(num_blocks=24, kv_events=events_config())
    for i in range(8):  # far more distinct blocks than the pool holds
        llm.generate([[100 + i] * 17], greedy(2))
    events = events_of(llm.engine.kv.publisher)
    assert any(isinstance(e, BlockRemoved) for e in events)
    held = live_hashes(events, "GPU")
    cache = llm.engine.kv.cache
    assert len(held) == cache.stats().cached
    ns = llm.engine.namespace
    assert all(cache.lookup_hash(ns, h, tokens) is not None for h, tokens in held.items())


def test_flush_publishes_removals(make_llm: Callable[..., LLM]) -> None:
    llm = make_llm(num_blocks=64, kv_events=events_config())
    llm.generate([list(range(40, 60))], greedy(1))
    assert llm.engine.admin(Flush()) > 0
    assert live_hashes(events_of(llm.engine.kv.publisher), "GPU") == {}


def test_a_tenants_salt_never_appears_in_events(make_llm: Callable[..., LLM]) -> None:
    llm = make_llm(num_blocks=64, kv_events=events_config())
    prompt = list(range(60, 80))
    salt = "tenant:acme-secret-salt"
    llm.generate([prompt], greedy(1), cache_salt=salt)
    llm.generate([prompt], greedy(1))
    payloads = [payload for _, _, payload in replay(llm.engine.kv.publisher)]
    assert all(salt.encode() not in p for p in payloads)
    stored = [e for e in events_of(llm.engine.kv.publisher) if isinstance(e, BlockStored)]
    salted, plain = stored[0].block_hashes[0], stored[1].block_hashes[0]
    assert stored[0].token_ids[:BS] == stored[1].token_ids[:BS] and salted != plain
    assert salted == block_hashes(llm.engine.namespace.with_salt(salt), prompt[:BS])[0]


def test_lower_tiers_publish_what_they_gain_and_drop(make_llm: Callable[..., LLM]) -> None:
    one_block = 2 * 2 * BS * 2 * 16 * 4 + 256  # tiny llama: a block's KV plus the codec header
    tiers = TierConfig(host_bytes=6 * one_block, queue_blocks=1024)
    llm = make_llm(num_blocks=16, kv_events=events_config(), tiers=tiers)
    for i in range(16):
        llm.generate([[200 + i] * 13], greedy(1))
    llm.engine.kv.tiers.store.wait_idle(10)
    events = events_of(llm.engine.kv.publisher)
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    device_removed = {h for e in removed if e.medium == "GPU" for h in e.block_hashes}
    host_stored = [e for e in events if isinstance(e, BlockStored) and e.medium == "CPU"]
    host_removed = [e for e in removed if e.medium == "CPU"]
    assert host_stored and all(e.token_ids == [] for e in host_stored)
    assert {h for e in host_stored for h in e.block_hashes} <= device_removed
    assert host_removed  # the host budget holds a few blocks only
    assert len(live_hashes(events, "CPU")) == len(llm.engine.kv.tiers.store.tiers[0])


def test_wire_layout_is_vllms() -> None:
    """EventBatch is an array [ts, events, rank]; an event a map tagged by "type", defaults out."""
    pub = ZmqEventPublisher(events_config(topic="kv"))
    try:
        pub.offer(BlockStored([1, 2], None, list(range(8)), 4, None, "GPU", None))
        pub.offer(BlockRemoved([2], "GPU"))
        (seq, topic, payload), *_ = [r for r in replay(pub) if r[0] == 0]
    finally:
        pub.close()
    ts, events, rank = msgspec.msgpack.decode(payload)
    assert (seq, topic, rank) == (0, b"kv", 0) and ts > 0
    assert events == [
        {
            "type": "BlockStored",
            "block_hashes": [1, 2],
            "parent_block_hash": None,
            "token_ids": list(range(8)),
            "block_size": 4,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
        },
        {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"},
    ]


def test_live_messages_are_topic_seq_payload() -> None:
    pub = ZmqEventPublisher(KVEventsConfig(LOOPBACK, topic="kv-events"))
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    try:
        deadline = time.monotonic() + 10
        frames = None
        while frames is None and time.monotonic() < deadline:  # until the SUB has joined
            pub.offer(AllBlocksCleared())
            if sub.poll(50):
                frames = sub.recv_multipart()
        assert frames is not None
        topic, seq, payload = frames
        assert topic == b"kv-events" and len(seq) == 8
        assert msgspec.msgpack.decode(payload)[1] == [{"type": "AllBlocksCleared"}]
        pub.offer(AllBlocksCleared())
        _, seq2, _ = sub.recv_multipart() if sub.poll(5000) else (None, None, None)
        assert seq2 is not None and int.from_bytes(seq2, "big") == int.from_bytes(seq, "big") + 1
    finally:
        sub.close(linger=0)
        ctx.term()
        pub.close()


def test_a_full_queue_drops_and_counts_never_blocks() -> None:
    pub = ZmqEventPublisher(events_config(max_queue_events=4))
    try:
        t0 = time.perf_counter()
        for _ in range(20_000):
            pub.offer(AllBlocksCleared())
        assert time.perf_counter() - t0 < 5  # offer never waited for the publisher
        published = sum(len(msgspec.msgpack.decode(p)[1]) for _, _, p in replay(pub))
    finally:
        pub.close()
    assert pub.stats.dropped > 0
    assert pub.stats.offered == 20_000 == published + pub.stats.dropped


def test_config_rejects_a_non_zmq_address() -> None:
    with pytest.raises(ValueError, match="ZMQ address"):
        KVEventsConfig("localhost:5557")
