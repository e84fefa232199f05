"""The Redis tier on a real 3-master Redis Cluster (tests/fresh_cluster.py): routing, one pipeline
per node, a master killed or restarted empty, slots moved under the client, corrupt values; then
the engine (tiny float32 llama, 4-token blocks) through the cluster tier against cache-off output."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.connection import Connection

from engine.kv.admin import Flush
from engine.llm import LLM
from engine.outputs import RequestResult
from engine.request import Prompt
from radixcache.hashing import Namespace
from storage.codec import HEADER_SIZE
from storage.config import TierConfig
from storage.redis_nodes import ClusterAddress, parse_cluster_url
from storage.redis_tier import RedisTier
from storage.tiered import TieredStore
from tests.ports import free_port
from tests.redis_cluster import ClusterNode, RedisClusterServers, running_cluster
from tests.storage.blocks import chain, encoded
from tests.tier_workload import (
    DEVICE_BLOCKS,
    ENGINE,
    PARAMS,
    cache_off_reference,
    tier_prompts,
    token_ids,
)


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """One cluster for the tests that kill nothing (emptied before each)."""
    with running_cluster(tmp_path_factory.mktemp("shared-cluster")) as cluster:
        yield cluster


@pytest.fixture
def fresh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A cluster of its own, for the tests that kill or restart nodes."""
    with running_cluster(tmp_path_factory.mktemp("fresh-cluster")) as cluster:
        yield cluster


@pytest.fixture
def cluster(shared_cluster: RedisClusterServers) -> RedisClusterServers:
    for node in shared_cluster.nodes:
        node.client().flushall()
    return shared_cluster


class Clock:
    """The tier's clock, moved by hand past its cool-downs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def by_owner(cluster: RedisClusterServers, tier: RedisTier, ns: Namespace, hashes: list[int]):
    return [cluster.owner(tier.key(ns, h)) for h in hashes]


# --- URL ---
def test_cluster_url_parsing() -> None:
    assert parse_cluster_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7001") == ClusterAddress(
        (("10.0.0.1", 7000), ("10.0.0.2", 7001))
    )
    assert parse_cluster_url("rediss+cluster://u:p%40ss@[::1]:7000,host/0") == ClusterAddress(
        (("::1", 7000), ("host", 6379)), "u", "p@ss", ssl=True
    )
    for bad in ("redis+cluster://", "redis+cluster://h:7000/1", "redis+cluster://h:x"):
        with pytest.raises(ValueError):
            parse_cluster_url(bad)


# --- the tier on a healthy cluster ---
def test_keys_spread_over_every_master_with_ttl(
    cluster: RedisClusterServers, ns: Namespace
) -> None:
    tier = RedisTier(cluster.url, prefix="rc-test", ttl_s=600)
    hashes = chain(ns, 60)
    items = encoded(hashes)
    tier.put(ns, items)
    key = f"rc-test:{ns.hex}:{hashes[0]:016x}"  # the spill format of DESIGN.md, no hash tag
    assert cluster.client().exists(key) == 1
    assert 590 <= cluster.client().ttl(key) <= 600
    per_node = [node.client().dbsize() for node in cluster.nodes]
    assert sum(per_node) == 60 and min(per_node) >= 10, per_node  # ~20 each, by slot
    assert tier.contains(ns, hashes) == [True] * 60
    assert tier.get(ns, hashes) == [v for _, v in items]
    snap = tier.stats.snapshot()
    assert snap["nodes_up"] == 3 and snap["nodes_down"] == 0
    assert sorted(snap["nodes"]) == sorted(n.address for n in cluster.nodes)
    assert sum(h["blocks_read"] for h in snap["nodes"].values()) == 60
    tier.close()


def test_a_load_back_is_one_write_per_node(
    cluster: RedisClusterServers, ns: Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier = RedisTier(cluster.url)
    hashes = chain(ns, 48)
    tier.put(ns, encoded(hashes))
    sends: list[int] = []  # port of each socket write (one batch of commands each)
    send = Connection.send_packed_command

    def counting(conn: Connection, command, check_health: bool = True) -> None:
        sends.append(conn.port)
        return send(conn, command, check_health)

    monkeypatch.setattr(Connection, "send_packed_command", counting)
    assert all(v is not None for v in tier.get(ns, hashes))
    assert sorted(sends) == sorted(n.port for n in cluster.nodes)  # one round trip per master
    tier.close()


def test_corrupt_value_on_one_node_is_discarded(
    cluster: RedisClusterServers, ns: Namespace
) -> None:
    tier = RedisTier(cluster.url)
    hashes = chain(ns, 6)
    items = encoded(hashes)
    tier.put(ns, items)
    key = tier.key(ns, hashes[2])
    node = cluster.owner(key)
    bad = bytearray(items[2][1])
    bad[HEADER_SIZE + 3] ^= 0x01
    node.client().set(key, bytes(bad))  # planted straight on the master that owns the slot
    got = tier.get(ns, hashes)
    assert got == [v for _, v in items[:2]] + [None] + [v for _, v in items[3:]]
    assert tier.stats.corrupt == 1
    assert node.client().exists(key) == 0  # deleted, not served again
    tier.close()


def test_moved_slots_reread_the_topology(cluster: RedisClusterServers, ns: Namespace) -> None:
    tier = RedisTier(cluster.url)
    hashes = chain(ns, 12)
    items = encoded(hashes)
    tier.put(ns, items)
    moved = [tier.key(ns, h) for h in hashes[:3]]
    for key in moved:  # the tier's slot map is now stale for these keys
        migrate_slot(cluster, key)
    assert tier.get(ns, hashes) == [v for _, v in items]
    stats = tier.stats.snapshot()
    assert stats["topology_refreshes"] >= 1
    assert sum(h["redirects"] for h in stats["nodes"].values()) >= 1
    assert stats["errors"] == 0
    tier.close()


def migrate_slot(cluster: RedisClusterServers, key: str) -> None:
    """Moves the slot of `key` (with its keys) to another master, as a resharding does."""
    slot = cluster.client().keyslot(key)
    source = cluster.owner(key)
    target = next(n for n in cluster.nodes if n is not source)
    src, dst = source.client(), target.client()
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source.node_id())
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target.node_id())
    keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
    if keys:
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
    for node in cluster.nodes:
        node.client().execute_command("CLUSTER SETSLOT", slot, "NODE", target.node_id())
    assert cluster.owner(key) is target


def test_unreachable_cluster_is_a_miss(ns: Namespace) -> None:
    tier = RedisTier(f"redis+cluster://127.0.0.1:{free_port()}", socket_timeout_s=0.2)
    start = time.perf_counter()
    assert tier.get(ns, chain(ns, 2)) == [None, None]
    tier.put(ns, encoded(chain(ns, 2)))
    assert tier.contains(ns, chain(ns, 2)) == [False, False]
    assert time.perf_counter() - start < 2.0  # one failed connect, then the breaker answers
    assert tier.stats.breaker_opens == 1 and tier.stats.rejected_writes == 2
    assert not tier.available()
    tier.close()


# --- faults: a fresh cluster per test ---
def test_dead_master_costs_only_its_blocks(fresh_cluster: RedisClusterServers, ns) -> None:
    clock = Clock()
    tier = RedisTier(fresh_cluster.url, cooldown_s=5.0, clock=clock)
    hashes = chain(ns, 60)
    items = encoded(hashes)
    tier.put(ns, items)
    dead = fresh_cluster.owner(tier.key(ns, hashes[0]))
    on_dead = [o is dead for o in by_owner(fresh_cluster, tier, ns, hashes)]
    dead.kill()

    start = time.perf_counter()
    got = tier.get(ns, hashes)  # the failing call: dead node's blocks miss, the rest are served
    assert got == [None if d else v for d, (_, v) in zip(on_dead, items, strict=True)]
    for _ in range(20):  # breaker open: the dead node is skipped, no connect attempts
        assert tier.contains(ns, hashes) == [not d for d in on_dead]
    more = chain(ns, 30, start=10_000)
    more_dead = sum(o is dead for o in by_owner(fresh_cluster, tier, ns, more))
    tier.put(ns, encoded(more, seed=50))  # the dead node's share goes to stand-in keys
    assert time.perf_counter() - start < 2.0  # nothing waits on the dead node
    health = tier.stats.snapshot()["nodes"]
    assert health[dead.address]["up"] == 0 and health[dead.address]["breaker_opens"] == 1
    assert health[dead.address]["rejected_writes"] == more_dead > 0
    assert health[dead.address]["handed_off"] == more_dead
    assert tier.stats.rejected_writes == 0  # every block is stored somewhere
    assert all(h["up"] == 1 and h["errors"] == 0 for a, h in health.items() if a != dead.address)
    assert tier.get(ns, more) == [v for _, v in encoded(more, seed=50)]
    assert tier.stats.snapshot()["nodes_down"] == 1

    tier.put(ns, items)  # what the engine does after recomputing the lost blocks
    assert tier.get(ns, hashes) == [v for _, v in items]  # the lost blocks are found again

    fresh_cluster.restart(dead)  # same slots, no data
    clock.now = 5.0  # cool-down over: topology reread, node tried again
    assert tier.get(ns, hashes) == [
        None if d else v for d, (_, v) in zip(on_dead, items, strict=True)
    ]
    assert tier.stats.snapshot()["nodes_down"] == 0 and tier.available()
    tier.put(ns, items)  # refilled
    assert tier.get(ns, hashes) == [v for _, v in items]
    tier.close()


def test_failover_to_a_replica_is_picked_up(fresh_cluster: RedisClusterServers, ns) -> None:
    clock = Clock()
    tier = RedisTier(fresh_cluster.url, cooldown_s=5.0, clock=clock)
    hashes = chain(ns, 30)
    items = encoded(hashes)
    master = fresh_cluster.owner(tier.key(ns, hashes[0]))
    replica = fresh_cluster.add_replica(master)
    tier.put(ns, items)
    assert master.client().execute_command("WAIT", 1, 5000) == 1  # replicated before the crash
    on_master = [o is master for o in by_owner(fresh_cluster, tier, ns, hashes)]
    master.kill()
    assert tier.get(ns, hashes) == [
        None if m else v for m, (_, v) in zip(on_master, items, strict=True)
    ]
    fresh_cluster.wait_promoted(replica)
    clock.now = 5.0  # half-open: the tier rereads the slot map and finds the promoted replica
    assert tier.get(ns, hashes) == [v for _, v in items]
    snap = tier.stats.snapshot()
    assert snap["nodes"][replica.address]["up"] == 1 and snap["topology_refreshes"] >= 1
    assert master.address not in snap["nodes"] and snap["nodes_down"] == 0
    tier.close()


# --- the engine through the cluster tier ---
@pytest.fixture(scope="module")
def model(tiny_llama: Path) -> Path:
    return tiny_llama


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return tier_prompts()


@pytest.fixture(scope="module")
def expected(model: Path, prompts: list[list[int]]) -> list[list[int]]:
    return cache_off_reference(model, prompts)


def cluster_llm(model: Path, url: str, **tiers: object) -> LLM:
    cfg = TierConfig(redis_url=url, redis_prefix="e2e", **tiers)
    return LLM(str(model), **ENGINE, num_blocks=DEVICE_BLOCKS, tiers=cfg)


def store_of(llm: LLM) -> TieredStore:
    return llm.engine.kv.tiers.store


def settle(llm: LLM) -> dict:
    llm.engine.admin(Flush())
    assert store_of(llm).wait_idle(30)
    return store_of(llm).stats().tiers["redis"].stats.snapshot()


def redis_tokens(outputs: list) -> int:
    return sum(o.cached_tokens_by_tier.get("redis", 0) for o in outputs)


def all_cached_from_redis(outputs: list) -> bool:
    """After a flush: every 48-token prompt finds its 12 blocks cached and computes only its last
    token, the first one all from Redis (the others share its first 6 blocks on the device)."""
    first = outputs[0].cached_tokens_by_tier.get("redis", 0)
    return first == 47 and all(o.num_cached_tokens == 47 for o in outputs)


def test_engine_output_through_the_cluster_equals_cache_off(
    model: Path, prompts, expected, cluster: RedisClusterServers
) -> None:
    llm = cluster_llm(model, cluster.url)
    assert token_ids(llm.generate(prompts, PARAMS)) == expected
    settle(llm)
    outs = llm.generate(prompts, PARAMS)  # the device pool was emptied: all from the cluster
    assert token_ids(outs) == expected
    assert all_cached_from_redis(outs)
    stats = settle(llm)
    assert stats["hits"] > 0 and stats["errors"] == 0 and stats["nodes_up"] == 3
    assert all(h["blocks_read"] > 0 for h in stats["nodes"].values())  # every master served
    llm.engine.close()


def test_two_engines_share_one_cluster_tenants_isolated(
    model: Path, prompts, expected, cluster: RedisClusterServers
) -> None:
    first = cluster_llm(model, cluster.url, write_policy="write-through")
    assert token_ids(first.generate(prompts, PARAMS)) == expected
    assert store_of(first).wait_idle(30)
    second = cluster_llm(model, cluster.url)
    outs = second.generate(prompts, PARAMS)
    assert token_ids(outs) == expected
    assert outs[0].cached_tokens_by_tier.get("redis", 0) >= 40  # computed by the first engine
    salted = second.generate(prompts, PARAMS, cache_salt="tenant-b")
    assert token_ids(salted) == expected and redis_tokens(salted) == 0
    first.engine.close()
    second.engine.close()


def test_master_killed_mid_workload_then_restarted_empty(
    model: Path, prompts, expected, fresh_cluster: RedisClusterServers
) -> None:
    llm = cluster_llm(model, fresh_cluster.url, redis_cooldown_s=0.0, redis_timeout_s=0.5)
    assert token_ids(llm.generate(prompts, PARAMS)) == expected
    settle(llm)
    tier = next(t for t in store_of(llm).tiers if t.name == "redis")
    dead = fresh_cluster.owner(tier.key(llm.engine.namespace, 0))
    assert token_ids(run_killing(llm, prompts, dead)) == expected
    stats = settle(llm)
    health = stats["nodes"][dead.address]
    assert health["errors"] >= 1 and health["rejected_writes"] > 0
    assert stats["nodes_up"] == 2 and health["handed_off"] > 0
    assert all(h["errors"] == 0 for a, h in stats["nodes"].items() if a != dead.address)
    outs = llm.generate(prompts, PARAMS)  # node still dead: its blocks come from stand-ins
    assert token_ids(outs) == expected and all_cached_from_redis(outs)

    fresh_cluster.restart(dead)  # back, empty: its blocks are recomputed and written again
    assert token_ids(llm.generate(prompts, PARAMS)) == expected
    stats = settle(llm)
    assert stats["nodes_up"] == 3 and stats["nodes"][dead.address]["blocks_written"] > 0
    outs = llm.generate(prompts, PARAMS)
    assert token_ids(outs) == expected and all_cached_from_redis(outs)
    llm.engine.close()


def run_killing(llm: LLM, prompts: list[list[int]], node: ClusterNode) -> list[RequestResult]:
    """Runs the prompts, SIGKILLing `node` once the first two requests have finished."""
    engine = llm.engine
    results = {f"kill-{i}": RequestResult(f"kill-{i}") for i in range(len(prompts))}
    for rid, prompt in zip(results, prompts, strict=True):
        engine.add_request(rid, Prompt(list(prompt)), PARAMS)
    finished = 0
    while finished < len(results):
        for out in engine.step():
            results[out.request_id].add(out)
            finished += out.finished
        if finished >= 2 and node.running:
            node.kill()
    return list(results.values())


def test_corrupt_values_on_one_node_are_recomputed(
    model: Path, prompts, expected, cluster: RedisClusterServers
) -> None:
    llm = cluster_llm(model, cluster.url)
    assert token_ids(llm.generate(prompts, PARAMS)) == expected
    settle(llm)
    node = cluster.nodes[0]
    client = node.client()
    keys = client.keys("e2e:*")
    assert keys
    for i, key in enumerate(keys):  # every block on this master damaged
        value = bytearray(client.get(key))
        value[HEADER_SIZE + i % 64] ^= 0x10
        client.set(key, bytes(value))
    assert token_ids(llm.generate(prompts, PARAMS)) == expected
    stats = settle(llm)
    assert stats["corrupt"] > 0
    llm.engine.close()


# --- the server's flags ---
def test_cli_flags_select_the_cluster_tier_and_ttl() -> None:
    from api.cli import build_parser, tier_config

    url = "redis+cluster://10.0.0.1:7000,10.0.0.2:7000"
    args = build_parser().parse_args(
        ["serve", "--no-disk", "--redis-url", url, "--redis-ttl", "60"]
    )
    tiers = tier_config(args)
    assert tiers.redis_url == url and tiers.redis_ttl_s == 60
    forever = build_parser().parse_args(["serve", "--redis-url", url, "--redis-ttl", "0"])
    assert tier_config(forever).redis_ttl_s is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--redis-ttl", "-1"])
    with pytest.raises(ValueError):
        TierConfig(redis_url=url, redis_ttl_s=0)


# --- per-node health through the API ---
def test_node_health_in_cache_stats_and_metrics(model: Path, fresh_cluster) -> None:
    from api.config import ApiConfig
    from radixcache.hashing import block_hashes
    from tests.api.servers import BLOCK_SIZE, engine_config, fresh_text, metric, start_server

    tiers = TierConfig(redis_url=fresh_cluster.url, redis_prefix="api", redis_cooldown_s=600)
    server = start_server(engine_config(model, num_blocks=64, tiers=tiers), ApiConfig())
    try:
        prompt = fresh_text(6 * BLOCK_SIZE + 2, 61)
        body = {"model": server.model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
        with httpx.Client(base_url=server.url, timeout=60.0) as http:
            first = http.post("/v1/completions", json=body).json()
            http.post("/v1/cache/flush")
            engine = server.engine.engine
            assert engine.kv.tiers.store.wait_idle(30)
            tier = next(t for t in engine.kv.tiers.store.tiers if t.name == "redis")
            tokens = engine.tokenizer.encode(prompt)
            (h,) = block_hashes(engine.namespace, tokens[:BLOCK_SIZE])
            dead = fresh_cluster.owner(tier.key(engine.namespace, h))
            dead.kill()
            again = http.post("/v1/completions", json=body).json()  # recomputed, same text
            assert again["choices"][0]["text"] == first["choices"][0]["text"]
            nodes = http.get("/v1/cache/stats").json()["redis_nodes"]
            text = http.get("/metrics").text
        assert sorted(nodes) == sorted(n.address for n in fresh_cluster.nodes)
        for node in fresh_cluster.nodes:
            up = 0 if node is dead else 1
            assert nodes[node.address]["up"] == up
            assert metric(text, "radixcache_redis_node_up", f'node="{node.address}"') == up
        errors = metric(text, "radixcache_redis_node_errors_total", f'node="{dead.address}"')
        assert errors == nodes[dead.address]["errors"] >= 1
    finally:
        server.stop()
