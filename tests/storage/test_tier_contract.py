"""The Tier interface, checked against every real tier: host, disk and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from radixcache.hashing import Namespace
from storage.base import Tier
from storage.disk import DiskTier
from storage.host import HostTier
from storage.redis_tier import RedisTier
from tests.redis_server import RedisServer
from tests.storage.blocks import VALUE_BYTES, chain, encoded


@pytest.fixture(params=["host", "disk", "redis"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tier]:
    if request.param == "host":
        t: Tier = HostTier(100 * VALUE_BYTES)
    elif request.param == "disk":
        t = DiskTier(tmp_path / "disk", 100 * VALUE_BYTES)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        t = RedisTier(server.url, prefix="test")
    yield t
    t.close()


def test_put_contains_get_delete(tier: Tier, ns: Namespace) -> None:
    hashes = chain(ns, 6)
    items = encoded(hashes[:4])
    assert tier.contains(ns, hashes) == [False] * 6
    assert tier.get(ns, hashes) == [None] * 6
    tier.put(ns, items)
    assert tier.contains(ns, hashes) == [True] * 4 + [False] * 2
    assert tier.get(ns, hashes) == [v for _, v in items] + [None, None]
    tier.delete(ns, hashes[1:3])
    assert tier.contains(ns, hashes) == [True, False, False, True, False, False]
    assert tier.stats.blocks_written == 4
    assert tier.stats.bytes_read == 4 * VALUE_BYTES


def test_empty_batches(tier: Tier, ns: Namespace) -> None:
    assert tier.contains(ns, []) == []
    assert tier.get(ns, []) == []
    tier.put(ns, [])
    tier.delete(ns, [])


def test_namespaces_are_isolated(tier: Tier, ns: Namespace) -> None:
    salted = ns.with_salt("tenant-b")
    other_model = Namespace("another-model", ns.kv_dtype, ns.block_size)
    hashes = chain(ns, 3)
    tier.put(ns, encoded(hashes))
    # the same hash values under another namespace must never be found
    for other in (salted, other_model):
        assert tier.contains(other, hashes) == [False] * 3
        assert tier.get(other, hashes) == [None] * 3
    tier.put(salted, encoded(hashes, seed=100))
    assert tier.get(ns, hashes) == [v for _, v in encoded(hashes)]
    assert tier.get(salted, hashes) == [v for _, v in encoded(hashes, seed=100)]
    tier.delete(salted, hashes)
    assert tier.contains(ns, hashes) == [True] * 3
