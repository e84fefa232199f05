from __future__ import annotations

import time

from radixcache.hashing import Namespace
from storage.codec import HEADER_SIZE
from storage.redis_tier import RedisTier
from tests.redis_server import RedisServer
from tests.storage.blocks import chain, encoded


def test_keys_carry_prefix_namespace_and_ttl(redis_server: RedisServer, ns: Namespace) -> None:
    tier = RedisTier(redis_server.url, prefix="rc-test", ttl_s=600)
    (h,) = chain(ns, 1)
    tier.put(ns, encoded([h]))
    key = f"rc-test:{ns.hex}:{h:016x}"
    client = redis_server.client()
    assert client.keys("*") == [key.encode()]
    assert 590 <= client.ttl(key) <= 600


def test_corrupt_value_is_discarded_and_counted(redis_server: RedisServer, ns: Namespace) -> None:
    tier = RedisTier(redis_server.url)
    hashes = chain(ns, 2)
    items = encoded(hashes)
    tier.put(ns, items)
    client = redis_server.client()
    bad = bytearray(items[1][1])
    bad[HEADER_SIZE] ^= 0xFF
    client.set(tier.key(ns, hashes[1]), bytes(bad))
    assert tier.get(ns, hashes) == [items[0][1], None]
    assert tier.stats.corrupt == 1
    assert client.exists(tier.key(ns, hashes[1])) == 0


def test_breaker_opens_on_kill_answers_fast_and_recovers(
    redis_server: RedisServer, ns: Namespace
) -> None:
    now = [0.0]
    tier = RedisTier(redis_server.url, cooldown_s=5.0, clock=lambda: now[0])
    hashes = chain(ns, 8)
    tier.put(ns, encoded(hashes[:4]))
    assert tier.contains(ns, hashes[:4]) == [True] * 4

    redis_server.kill()
    assert tier.get(ns, hashes[:4]) == [None] * 4  # the failing call: a miss, not an exception
    assert tier.stats.errors == 1 and tier.stats.breaker_opens == 1 and not tier.available()
    node = tier.stats.snapshot()["nodes"][f"127.0.0.1:{redis_server.port}"]  # the one server
    assert node["up"] == 0 and node["errors"] == 1
    start = time.perf_counter()
    for _ in range(100):
        assert tier.contains(ns, hashes) == [False] * 8
        assert tier.get(ns, hashes) == [None] * 8
        tier.put(ns, encoded(hashes[4:]))
    assert time.perf_counter() - start < 0.5  # no network while the breaker is open
    assert tier.stats.skipped_calls == 300 and tier.stats.rejected_writes == 400
    assert tier.stats.errors == 1

    redis_server.start()  # same port, empty (a restarted server)
    assert tier.contains(ns, hashes) == [False] * 8  # still cooling down: skipped
    assert tier.stats.skipped_calls == 301
    now[0] = 5.0
    tier.put(ns, encoded(hashes[4:]))  # half-open: tried, succeeds, breaker closed
    assert tier.available()
    assert tier.contains(ns, hashes) == [False] * 4 + [True] * 4
    assert tier.stats.errors == 1 and tier.stats.snapshot()["nodes_up"] == 1


def test_unreachable_at_start_is_a_miss(ns: Namespace) -> None:
    from tests.ports import free_port

    tier = RedisTier(f"redis://127.0.0.1:{free_port()}/0", socket_timeout_s=0.2)
    assert tier.get(ns, chain(ns, 2)) == [None, None]
    assert tier.stats.breaker_opens == 1
