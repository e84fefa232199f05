"""prompt_cache_retention in the persistent tiers: retained blocks outlive the disk's LRU pressure
for their 24 h, within a byte budget whose oldest grants lose their retention first (counted);
expiry with an injected clock; on Redis a retained key's TTL is the retention's, not cut short by
ordinary writes, and back to the ordinary TTL when the budget drops it."""

from __future__ import annotations

from pathlib import Path

from radixcache.hashing import Namespace
from storage.config import TierConfig
from storage.disk import DiskTier
from storage.redis_tier import RedisTier
from storage.retention import RETAIN_S
from storage.tiered import TieredStore
from tests.redis_server import RedisServer
from tests.storage.blocks import VALUE_BYTES, chain, encoded, make_block


def test_a_retained_prefix_survives_lru_pressure_that_evicts_unretained_blocks(
    tmp_path: Path, ns: Namespace
) -> None:
    tier = DiskTier(tmp_path, 6 * VALUE_BYTES, retained_bytes=3 * VALUE_BYTES)
    kept, plain, pressure = chain(ns, 3), chain(ns, 2, start=1000), chain(ns, 6, start=2000)
    tier.retain(ns, encoded(kept))
    tier.put(ns, encoded(plain, seed=10))
    tier.get(ns, plain)  # recently used: the LRU still takes them before any retained block
    tier.put(ns, encoded(pressure, seed=20))
    assert tier.contains(ns, kept) == [True] * 3
    assert tier.get(ns, kept) == [v for _, v in encoded(kept)]
    assert tier.contains(ns, plain) == [False, False]
    assert tier.stats.evictions == 5 and len(tier) == 6
    assert tier.used_bytes() == 6 * VALUE_BYTES
    stats = tier.retention_stats()
    assert (stats.blocks, stats.bytes, stats.dropped) == (3, 3 * VALUE_BYTES, 0)


def test_past_the_budget_the_oldest_prefix_loses_its_retention_tail_first(
    tmp_path: Path, ns: Namespace
) -> None:
    tier = DiskTier(tmp_path, 8 * VALUE_BYTES, retained_bytes=5 * VALUE_BYTES)
    a, b, c = chain(ns, 2), chain(ns, 2, start=100), chain(ns, 2, start=200)
    for prefix in (a, b, c):
        tier.retain(ns, encoded(prefix))
    stats = tier.retention_stats()
    assert (stats.blocks, stats.bytes, stats.dropped, stats.granted) == (5, 5 * VALUE_BYTES, 1, 6)
    # a's last block lost its retention (a still loads its head), b and c keep theirs
    assert (ns.hex, a[1]) not in tier.retention and (ns.hex, a[0]) in tier.retention
    tier.retain(ns, encoded(chain(ns, 1, start=300)))  # one more: a's head goes too
    assert (ns.hex, a[0]) not in tier.retention
    assert tier.retention_stats().dropped == 2
    # what lost its retention is an ordinary entry again, first in line for eviction
    assert tier.contains(ns, a) == [True, True]
    tier.put(ns, encoded(chain(ns, 3, start=400), seed=9))
    assert tier.contains(ns, a) == [False, False] and tier.stats.evictions == 2
    assert all(tier.contains(ns, b + c))


def test_retention_expires_and_a_renewal_extends_it(tmp_path: Path, ns: Namespace) -> None:
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    tier = DiskTier(tmp_path, 3 * VALUE_BYTES, retained_bytes=10 * VALUE_BYTES, clock=clock)
    renewed, once = chain(ns, 1), chain(ns, 1, start=100)
    tier.retain(ns, encoded(renewed))
    tier.retain(ns, encoded(once, seed=5))
    now[0] = 20 * 3600.0
    tier.retain(ns, encoded(renewed))  # asked again: 24 h from now
    now[0] = RETAIN_S + 1.0
    stats = tier.retention_stats()
    assert (stats.blocks, stats.expired, stats.dropped) == (1, 1, 0)
    assert (ns.hex, renewed[0]) in tier.retention and (ns.hex, once[0]) not in tier.retention
    # the expired block stays as an ordinary entry (the LRU's oldest), so pressure takes it
    assert tier.contains(ns, once) == [True]
    tier.put(ns, encoded(chain(ns, 2, start=200), seed=7))
    assert tier.contains(ns, once) == [False] and tier.contains(ns, renewed) == [True]
    now[0] = 20 * 3600.0 + RETAIN_S
    assert tier.retention_stats().expired == 2


def test_a_disk_smaller_than_the_budget_takes_the_oldest_retention_first(
    tmp_path: Path, ns: Namespace
) -> None:
    tier = DiskTier(tmp_path, 3 * VALUE_BYTES, retained_bytes=100 * VALUE_BYTES)
    old, new = chain(ns, 2), chain(ns, 2, start=100)
    tier.retain(ns, encoded(old))
    tier.retain(ns, encoded(new, seed=3))
    assert tier.contains(ns, new) == [True, True]
    assert tier.contains(ns, old) == [True, False]  # old's tail made room
    assert tier.retention_stats().dropped == 1 and tier.used_bytes() == 3 * VALUE_BYTES


def test_redis_retained_keys_live_24h_and_ordinary_writes_do_not_cut_them_short(
    redis_server: RedisServer, ns: Namespace
) -> None:
    tier = RedisTier(redis_server.url, prefix="keep", ttl_s=60, retained_bytes=3 * VALUE_BYTES)
    client = redis_server.client()
    first, second = chain(ns, 2), chain(ns, 2, start=100)
    tier.retain(ns, encoded(first))
    for h in first:
        assert RETAIN_S - 10 <= client.ttl(tier.key(ns, h)) <= RETAIN_S
    tier.put(ns, encoded(first))  # a spill or promotion of the same blocks
    assert RETAIN_S - 10 <= client.ttl(tier.key(ns, first[0])) <= RETAIN_S
    plain = chain(ns, 1, start=500)
    tier.put(ns, encoded(plain))
    assert client.ttl(tier.key(ns, plain[0])) <= 60
    # past the budget the oldest retained block gets the ordinary TTL back
    tier.retain(ns, encoded(second, seed=4))
    assert client.ttl(tier.key(ns, first[1])) <= 60
    assert client.ttl(tier.key(ns, first[0])) > 60
    assert tier.get(ns, first + second) == [v for _, v in encoded(first) + encoded(second, 4)]
    stats = tier.retention_stats()
    assert (stats.blocks, stats.dropped, stats.bytes) == (3, 1, 3 * VALUE_BYTES)


def test_redis_down_retains_nothing_and_raises_nothing(
    redis_server: RedisServer, ns: Namespace
) -> None:
    tier = RedisTier(redis_server.url, retained_bytes=10 * VALUE_BYTES, socket_timeout_s=0.2)
    redis_server.kill()
    tier.retain(ns, encoded(chain(ns, 2)))
    stats = tier.retention_stats()
    assert (stats.blocks, stats.granted) == (0, 0)
    assert tier.stats.rejected_writes == 2 and tier.stats.errors >= 1
    assert tier.get(ns, chain(ns, 2)) == [None, None]  # a miss: the engine recomputes


def test_the_store_retains_in_disk_else_redis_and_reports_it(
    tmp_path: Path, redis_server: RedisServer, ns: Namespace
) -> None:
    blocks = [(h, make_block(i)) for i, h in enumerate(chain(ns, 3))]
    both = TierConfig(host_bytes=1 << 20, disk_path=tmp_path / "d", redis_url=redis_server.url)
    for config, tier in ((both, "disk"), (TierConfig(redis_url=redis_server.url), "redis")):
        store = TieredStore(config)
        try:
            assert store.can_retain
            store.retain(ns, blocks)
            assert store.wait_idle(10)
            name, stats = store.stats().retention  # type: ignore[misc]
            assert name == tier and stats.blocks == 3 and stats.bytes == 3 * VALUE_BYTES
            assert store.locate(ns, [h for h, _ in blocks]) == [tier] * 3  # not in host
        finally:
            store.close()
    no_room = TierConfig(disk_path=tmp_path / "e", retained_bytes=0)
    for config in (TierConfig(host_bytes=1 << 20), no_room):
        store = TieredStore(config)
        try:
            assert not store.can_retain
            assert (store.stats().retention is None) == (config is not no_room)
        finally:
            store.close()


def test_a_restart_finds_the_retentions_still_running(tmp_path: Path, ns: Namespace) -> None:
    """A retained file carries its deadline as its modification time: a new process on the same
    folder retains it again for what is left, and the retentions that had ended stay ordinary."""
    first = DiskTier(tmp_path, 8 * VALUE_BYTES, retained_bytes=3 * VALUE_BYTES)
    dropped, kept, plain = chain(ns, 2), chain(ns, 3, start=1000), chain(ns, 2, start=2000)
    first.retain(ns, encoded(dropped))
    first.retain(ns, encoded(kept, seed=10))  # past the budget: `dropped` loses its retention
    first.put(ns, encoded(plain, seed=20))
    assert first.retention_stats().blocks == 3
    first.close()

    now = [0.0]
    second = DiskTier(
        tmp_path, 5 * VALUE_BYTES, retained_bytes=3 * VALUE_BYTES, clock=lambda: now[0]
    )
    stats = second.retention_stats()
    assert (stats.blocks, stats.bytes) == (3, 3 * VALUE_BYTES)  # `kept`, and only it
    assert len(second) == 5  # 7 files on a 5-block disk: the LRU gave up 2, none of them retained
    assert second.contains(ns, kept) == [True] * 3
    second.put(ns, encoded(chain(ns, 4, start=3000), seed=30))  # pressure
    assert second.contains(ns, kept) == [True] * 3
    assert second.contains(ns, dropped) == [False, False]
    now[0] = RETAIN_S  # what was left of the 24 h has run out
    assert second.retention_stats().blocks == 0
