"""`radixcache route` with real parts: real `radixcache serve` replicas (in-process, and a
subprocess one that is killed), real KV events over ZMQ, the official openai client."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest

from api.config import ApiConfig
from api.router.config import RouterConfig
from api.router.index import ReplicaIndex
from api.router.policy import Balance
from api.router.replicas import ReplicaSpec
from api.router.subscriber import EventSubscriber
from engine.kv.events import KVEventsConfig
from radixcache.shared.kv_events_wire import BatchDecoder, BlockRemoved, BlockStored
from tests.api.router_peers import (
    ReplicaProcess,
    ScriptedPeer,
    route_through_a_dying_replica,
    spawn_replica,
    start_router,
    wait_until,
)
from tests.api.servers import (
    ENGINE_SETTINGS,
    Server,
    engine_config,
    fresh_text,
    metric,
    start_server,
)

BS = ENGINE_SETTINGS["block_size"]
HEADER = "x-radixcache-replica"


# --- vLLM's schema, as vllm/distributed/kv_events.py documents it (the publisher's side) ---
class VllmBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class VllmEvent(msgspec.Struct, omit_defaults=True, tag=True):
    pass


class BlockStoredV(VllmEvent, tag="BlockStored"):
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


class BlockRemovedV(VllmEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class AllBlocksClearedV(VllmEvent, tag="AllBlocksCleared"):
    pass


class BlockMovedV(VllmEvent, tag="BlockMoved"):  # a tag this router does not know
    block_hashes: list[int]


def vllm_payload(*events: Any) -> bytes:
    return msgspec.msgpack.encode(VllmBatch(1.0, list(events), 0))


def stored(hashes: list, parent: Any, tokens: list[int], medium: str | None = "GPU") -> Any:
    return BlockStoredV(
        hashes, parent, tokens, BS, None, medium, None, [None] * len(hashes), 0, "full_attention"
    )


# --- decoding and the index ---
def test_decodes_vllms_format_and_counts_bad_events() -> None:
    decoder = BatchDecoder()
    h1, h2 = b"\x01" * 32, b"\x02" * 32  # vLLM may send sha256 digests as bytes
    payload = vllm_payload(
        stored([h1, h2], None, list(range(2 * BS))),
        BlockMovedV([1]),
        BlockRemovedV([h2], "GPU"),
        AllBlocksClearedV(),
    )
    events = decoder.decode(payload)
    assert [type(e) for e in events] == [BlockStored, BlockRemoved, type(events[2])]
    assert events[0].block_hashes == [h1, h2] and events[0].token_ids == list(range(2 * BS))
    assert events[0].block_size == BS and events[1].block_hashes == [h2]
    assert decoder.counts.bad_events == 1 and decoder.counts.bad_payloads == 0
    assert decoder.decode(b"\xc1 not msgpack") is None
    assert decoder.decode(msgspec.msgpack.encode({"ts": 1})) is None
    assert decoder.counts.bad_payloads == 2


def test_index_follows_stored_removed_cleared() -> None:
    index = ReplicaIndex(capacity_blocks=64, block_size=4)
    a, b, c = list(range(4)), list(range(4, 8)), list(range(8, 12))
    index.stored([1, 2], None, a + b, 4)
    index.stored([3], 2, c, 4)
    assert index.match(a + b + c + [99]) == 12
    index.removed([2])
    assert index.match(a + b + c) == 4  # a removed block cuts the prefix there
    index.stored([2], 1, b, 4)
    assert index.match(a + b + c) == 12
    index.stored([9], 777, c, 4)  # its parent was never seen: counted, not indexed
    assert index.counts.orphans == 1
    index.cleared()
    assert index.match(a + b + c) == 0


def test_with_events_what_was_sent_is_pending_until_confirmed_or_expired() -> None:
    a, b = list(range(4)), list(range(4, 8))
    waiting = ReplicaIndex(64, 4, exact=True, pending_s=60.0)
    waiting.sent(a + b + [0])
    assert waiting.match(a + b) == 8  # being computed there: follow it
    expired = ReplicaIndex(64, 4, exact=True, pending_s=0.0)
    expired.sent(a + b + [0])
    assert expired.match(a + b) == 0  # never confirmed by an event: not counted
    expired.stored([1], None, a, 4)
    assert expired.match(a + b) == 4  # the event confirms the first block only


def test_index_is_bounded_by_its_capacity() -> None:
    index = ReplicaIndex(capacity_blocks=8, block_size=4)
    for k in range(20):
        index.sent([100 + k] * 8)
    assert index.num_blocks() <= 8
    assert index.match([119] * 8) == 8  # the most recent survive


# --- subscriber against a scripted vLLM-protocol peer ---
@pytest.fixture
def peer() -> Iterator[ScriptedPeer]:
    p = ScriptedPeer()
    yield p
    p.close()


def test_a_gap_triggers_a_replay_and_bad_events_are_skipped(peer: ScriptedPeer) -> None:
    a, b, c, d = ([i] * BS for i in range(4))
    peer.record(0, vllm_payload(AllBlocksClearedV()))
    peer.record(1, vllm_payload(stored([11], None, a)))
    index, lock = ReplicaIndex(1024, BS), threading.Lock()
    sub = EventSubscriber("r0", peer.endpoint, peer.replay_endpoint, index, lock)
    sub.start()
    try:
        wait_until(lambda: sub.next_seq == 2, 10, "the replay on connect")
        assert peer.replay_requests == [0] and index.match(a) == BS
        peer.record(2, vllm_payload(stored([12], 11, b)))  # missed live
        peer.record(3, b"\x93garbage")  # not an EventBatch
        peer.record(4, vllm_payload(BlockMovedV([5]), stored([13], 12, c)))
        # live from here on: the first batch the SUB sees after joining shows the gap
        wait_until(lambda: _publish_until_seen(peer, sub, 5, stored([14], 13, d)), 10, "seq 5")
        assert sub.counts.gaps >= 1 and 2 in peer.replay_requests
        with lock:
            assert index.match(a + b + c + d) == 4 * BS
        assert sub.decoder.counts.bad_payloads == 1 and sub.decoder.counts.bad_events == 1
    finally:
        sub.close()


def test_a_hybrid_replicas_sliding_window_group_is_not_indexed(peer: ScriptedPeer) -> None:
    """Group 1 (sliding window) repeats group 0's blocks; removing its blocks (a twin evicted on
    its own) leaves the full-attention index as it was."""
    a, b = [1] * BS, [2] * BS
    window = BlockStoredV([11, 12], None, a + b, BS, None, "GPU", None, None, 1, "sliding_window")
    peer.record(0, vllm_payload(stored([11, 12], None, a + b), window))
    peer.record(1, vllm_payload(BlockRemovedV([12], "GPU", 1)))
    index, lock = ReplicaIndex(1024, BS), threading.Lock()
    sub = EventSubscriber("r0", peer.endpoint, peer.replay_endpoint, index, lock)
    sub.start()
    try:
        wait_until(lambda: sub.next_seq == 2, 10, "the replay on connect")
        with lock:
            assert index.match(a + b) == 2 * BS
        assert sub.counts.window_group_events == 2 and sub.window_groups == {1}
    finally:
        sub.close()


def _publish_until_seen(peer: ScriptedPeer, sub: EventSubscriber, seq: int, event: Any) -> bool:
    """Publishes `seq` live (the SUB may not have joined yet: then it is resent) until applied."""
    if sub.next_seq is not None and sub.next_seq > seq:
        return True
    peer.log = [(s, p) for s, p in peer.log if s != seq]
    peer.publish(seq, vllm_payload(event))
    return False


def test_a_restarted_publisher_clears_the_index(peer: ScriptedPeer) -> None:
    a, b = [1] * BS, [2] * BS
    peer.record(0, vllm_payload(stored([11], None, a)))
    peer.record(1, vllm_payload(stored([12], 11, b)))
    index, lock = ReplicaIndex(1024, BS), threading.Lock()
    sub = EventSubscriber("r0", peer.endpoint, peer.replay_endpoint, index, lock)
    sub.start()
    try:
        wait_until(lambda: sub.next_seq == 2, 10, "the replay on connect")
        peer.log = []  # the replica restarts: a new log from seq 0, an empty cache
        restarted = vllm_payload(stored([21], None, b))
        wait_until(lambda: _restart_seen(peer, sub, restarted), 10, "the restart")
        wait_until(lambda: index.match(b) == BS, 10, "the new batch")
        with lock:
            assert index.match(a + b) == 0 and sub.counts.restarts == 1
    finally:
        sub.close()


def _restart_seen(peer: ScriptedPeer, sub: EventSubscriber, payload: bytes) -> bool:
    if sub.counts.restarts:
        return True
    peer.log = []
    peer.publish(0, payload)  # resent until seen (copies after the first are duplicates)
    return False


# --- the router in front of real replicas ---
@pytest.fixture(scope="module")
def replicas(tiny_llama: Path) -> Iterator[list[Server]]:
    events = KVEventsConfig("tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
    servers = [
        start_server(engine_config(tiny_llama, kv_events=events), ApiConfig()) for _ in range(2)
    ]
    yield servers
    for s in servers:
        s.stop()


def spec_of(server: Server) -> ReplicaSpec:
    pub = server.engine.kv_events
    return ReplicaSpec(server.url, pub.endpoint, pub.replay_endpoint)


@pytest.fixture(scope="module")
def router(replicas: list[Server], tiny_llama: Path) -> Iterator[Any]:
    config = RouterConfig(tuple(spec_of(s) for s in replicas), tiny_llama, block_size=BS)
    handle = start_router(config)
    yield handle
    handle.stop()


def test_later_turns_go_to_the_replica_holding_the_earlier_ones(
    router: Any, replicas: list[Server]
) -> None:
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="none", max_retries=0)
    model = replicas[0].model
    users = {u: [{"role": "system", "content": fresh_text(120, seed=u)}] for u in range(4)}
    homes: dict[int, set[str]] = {u: set() for u in users}
    misses = router.stats()["tokenizer"]["stretch_misses"]
    for turn in range(3):
        for u, history in users.items():
            history.append({"role": "user", "content": fresh_text(40, seed=100 * turn + u)})
            raw = client.chat.completions.with_raw_response.create(
                model=model,
                messages=history,
                max_tokens=8,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            reply = raw.parse()
            homes[u].add(raw.headers[HEADER])
            if turn > 0:
                assert reply.usage.prompt_tokens_details.cached_tokens > 0
            history.append({"role": "assistant", "content": reply.choices[0].message.content})
            _wait_indexed(router, raw.headers[HEADER], reply.usage.prompt_tokens)
    assert all(len(h) == 1 for h in homes.values()), homes
    assert {h for hs in homes.values() for h in hs} == {"r0", "r1"}  # users spread over both
    stats = router.stats()
    for r in stats["replicas"].values():
        assert r["requests"] > 0 and r["predicted_cached_tokens"] > 0
        assert r["reported_cached_tokens"] > 0 and r["prompt_tokens"] > 0
    assert stats["decisions"]["cache_hit"] >= 8 and stats["overhead"]["count"] >= 12
    # turns 2 and 3 were routed on their seen part, their new messages tokenized after
    wait_until(lambda: not router.state.background, 10, "the tails' tokenization")
    assert router.stats()["overhead"]["deferred_count"] >= 8
    # each request tokenized at most its 2 new stretches (the last answer, the new message),
    # besides the separators and generation prompt every chat shares
    assert stats["tokenizer"]["segmented"]
    assert stats["tokenizer"]["stretch_misses"] - misses <= 2 + 2 * 12


def _wait_indexed(router: Any, name: str, prompt_tokens: int) -> None:
    """Until the replica's events for this prompt's full blocks reached the router's index."""
    replica = next(r for r in router.state.replicas if r.name == name)
    blocks = (prompt_tokens - 1) // BS
    wait_until(lambda: replica.index.counts.stored_blocks >= blocks, 10, "the replica's events")


def test_streaming_passes_through_and_reports_usage(router: Any, replicas: list[Server]) -> None:
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": fresh_text(60, seed=7)}]
    chunks = list(
        client.chat.completions.create(
            model=replicas[0].model,
            messages=messages,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    direct = openai.OpenAI(
        base_url=f"{replicas[0].url}/v1", api_key="none"
    ).chat.completions.create(
        model=replicas[0].model,
        messages=messages,
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert text == direct.choices[0].message.content and chunks[-1].usage.prompt_tokens > 0
    scrape = httpx.get(f"{replicas[0].url}/metrics", timeout=10).text
    assert metric(scrape, "radixcache_kv_events_offered_total") > 0
    assert metric(scrape, "radixcache_kv_events_dropped_total") == 0


def test_round_robin_alternates_and_bad_input_is_a_4xx(
    replicas: list[Server], tiny_llama: Path
) -> None:
    config = RouterConfig(
        tuple(spec_of(s) for s in replicas),
        tiny_llama,
        policy="round-robin",
        api=ApiConfig(api_keys={"sk-a": "a"}),
    )
    handle = start_router(config)
    try:
        body = {"model": replicas[0].model, "prompt": "hello", "max_tokens": 2}
        auth = {"authorization": "Bearer sk-a"}
        with httpx.Client(base_url=handle.url, timeout=60) as http:
            seen = [
                http.post("/v1/completions", json=body, headers=auth).headers[HEADER]
                for _ in range(4)
            ]
            assert seen == ["r0", "r1", "r0", "r1"]
            assert http.post("/v1/completions", json=body).status_code == 401
            bad = http.post("/v1/completions", content=b"{not json", headers=auth)
            assert bad.status_code == 400 and "error" in bad.json()
            missing = http.post("/v1/chat/completions", json={"model": "x"}, headers=auth)
            assert 400 <= missing.status_code < 500 and "error" in missing.json()
            wrong = http.post("/v1/completions", json={**body, "model": "nope"}, headers=auth)
            assert wrong.status_code == 404  # the replica's own answer, passed through
    finally:
        handle.stop()


@pytest.mark.slow
def test_a_killed_replica_loses_no_request(replicas: list[Server], tiny_llama: Path) -> None:
    doomed = spawn_replica(tiny_llama, ENGINE_SETTINGS)
    try:
        _route_through_a_dying_replica(doomed, replicas, tiny_llama)
    finally:
        doomed.kill()  # also when the router never started: no replica outlives the test


def _route_through_a_dying_replica(
    doomed: ReplicaProcess, replicas: list[Server], tiny_llama: Path
) -> None:
    config = RouterConfig(
        (ReplicaSpec.parse(doomed.spec), spec_of(replicas[0])),
        tiny_llama,
        policy="round-robin",
        health_interval_s=0.2,
    )
    handle = start_router(config)
    try:
        route_through_a_dying_replica(handle.url, handle.stats, replicas[0].model, doomed.kill)
    finally:
        handle.stop()


# --- prompt_cache_key: the key's replica while its load allows ---
def _chat(client: openai.OpenAI, model: str, seed: int, key: str | None, **kw: Any) -> Any:
    extra = {} if key is None else {"prompt_cache_key": key}
    return client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": fresh_text(50, seed=seed)}],
        max_tokens=2,
        temperature=0,
        **extra,
        **kw,
    )


def test_one_key_stays_on_one_replica_until_that_replica_is_overloaded(
    replicas: list[Server], tiny_llama: Path
) -> None:
    # any load above the least loaded replica's is too much: one request in flight saturates;
    # no events: the router's indexes hold only what it sent (both empty at its start)
    balance = Balance(abs_threshold=0, rel_threshold=1.0)
    specs = tuple(ReplicaSpec(s.url) for s in replicas)
    config = RouterConfig(specs, tiny_llama, balance=balance, block_size=BS)
    handle = start_router(config)
    client = openai.OpenAI(base_url=f"{handle.url}/v1", api_key="none", max_retries=0)
    model = replicas[0].model
    try:
        # without a key, unrelated prompts spread over the replicas (each a cache miss) ...
        spread = {_chat(client, model, 900 + i, None).headers[HEADER] for i in range(4)}
        assert spread == {"r0", "r1"}
        # ... with one key they stay where the key went first
        homes = {_chat(client, model, 910 + i, "customer-42").headers[HEADER] for i in range(4)}
        assert len(homes) == 1
        (home,) = homes
        assert handle.stats()["decisions"]["key_affinity"] == 3
        stream = client.completions.create(
            model=model,
            prompt=fresh_text(30, seed=920),
            max_tokens=400,
            stream=True,
            extra_body={"ignore_eos": True, "prompt_cache_key": "customer-42"},
        )
        try:
            next(iter(stream))  # in flight on the key's replica
            assert next(r for r in handle.state.replicas if r.name == home).load == 1
            elsewhere = _chat(client, model, 921, "customer-42").headers[HEADER]
            assert elsewhere != home
        finally:
            stream.close()
        affinity = handle.stats()["key_affinity"]
        assert affinity["keys"] == 1 and affinity["learned"] == 1 and affinity["moved"] == 1
    finally:
        handle.stop()


def test_a_keys_replica_that_goes_down_is_forgotten(
    replicas: list[Server], tiny_llama: Path
) -> None:
    spare = start_server(engine_config(tiny_llama), ApiConfig())
    try:
        # the spare (r0) starts with the emptier index: the key's first request goes there
        specs = (ReplicaSpec(spare.url), spec_of(replicas[0]))
        handle = start_router(RouterConfig(specs, tiny_llama, block_size=BS))
        client = openai.OpenAI(base_url=f"{handle.url}/v1", api_key="none", max_retries=0)
        model = replicas[0].model
        try:
            first = [_chat(client, model, 930 + i, "thread-9").headers[HEADER] for i in range(2)]
            assert first == ["r0", "r0"]
            spare.stop()
            after = [_chat(client, model, 940 + i, "thread-9").headers[HEADER] for i in range(2)]
            assert after == ["r1", "r1"]
            stats = handle.stats()
            assert not stats["replicas"]["r0"]["healthy"]
            assert stats["key_affinity"]["forgotten"] == 1 and stats["key_affinity"]["keys"] == 1
        finally:
            handle.stop()
    finally:
        spare.stop()
