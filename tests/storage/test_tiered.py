from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from radixcache.hashing import Namespace
from storage.codec import HEADER_SIZE, encode_block
from storage.config import TierConfig
from storage.disk import DiskTier
from storage.tiered import TieredStore
from tests.redis_server import RedisServer
from tests.storage.blocks import BLOCK_SHAPE, VALUE_BYTES, chain, encoded, make_block


def all_tiers(tmp_path: Path, url: str, host: int = 100, disk: int = 100, **kw) -> TieredStore:
    cfg = TierConfig(
        host_bytes=host * VALUE_BYTES,
        disk_path=tmp_path / "disk",
        disk_bytes=disk * VALUE_BYTES,
        redis_url=url,
        redis_prefix="t",
        **kw,
    )
    return TieredStore(cfg)


def blocks(n: int, seed: int = 0) -> list[torch.Tensor]:
    return [make_block(seed + i) for i in range(n)]


def test_longest_run_across_tiers(tmp_path: Path, redis_server: RedisServer, ns: Namespace) -> None:
    store = all_tiers(tmp_path, redis_server.url)
    host, disk, redis = store.tiers
    h = chain(ns, 7)
    kv = blocks(7)
    host.put(ns, [(h[i], encode_block(kv[i])) for i in (0, 1, 6)])
    disk.put(ns, [(h[i], encode_block(kv[i])) for i in (1, 2, 3)])
    redis.put(ns, [(h[i], encode_block(kv[i])) for i in (3, 4)])
    # h[5] is nowhere: the run stops there although h[6] is cached
    assert store.lookup_tokens(ns, h) == {"host": 8, "disk": 8, "redis": 4}
    result = store.load_prefix(ns, h, shape=BLOCK_SHAPE)
    assert result.tiers == ["host", "host", "disk", "disk", "redis"]
    assert all(torch.equal(a, b) for a, b in zip(result.blocks, kv[:5], strict=False))
    assert (host.stats.hits, disk.stats.hits, redis.stats.hits) == (2, 2, 1)
    assert (host.stats.hit_tokens, disk.stats.hit_tokens, redis.stats.hit_tokens) == (8, 8, 4)
    assert host.stats.misses == 4 and disk.stats.misses == 2 and redis.stats.misses == 1
    assert disk.stats.load_time_s > 0 and redis.stats.load_time_s > 0
    store.close()


def test_write_back_fills_the_top_and_spills_down(
    tmp_path: Path, redis_server: RedisServer, ns: Namespace
) -> None:
    store = all_tiers(tmp_path, redis_server.url, host=2, disk=2)
    host, disk, redis = store.tiers
    h = chain(ns, 6)
    store.store(ns, list(zip(h, blocks(6), strict=True)))
    assert store.wait_idle(10)
    assert host.contains(ns, h) == [False] * 4 + [True] * 2
    assert disk.contains(ns, h) == [False, False, True, True, False, False]
    assert redis.contains(ns, h) == [True, True] + [False] * 4
    assert (host.stats.evictions, disk.stats.evictions) == (4, 2)
    result = store.load_prefix(ns, h)
    assert result.tiers == ["redis", "redis", "disk", "disk", "host", "host"]
    assert all(torch.equal(a, b) for a, b in zip(result.blocks, blocks(6), strict=True))
    store.close()


def test_write_through_sends_every_block_to_redis(
    tmp_path: Path, redis_server: RedisServer, ns: Namespace
) -> None:
    store = all_tiers(tmp_path, redis_server.url, host=2, write_policy="write-through")
    host, disk, redis = store.tiers
    h = chain(ns, 4)
    store.store(ns, list(zip(h, blocks(4), strict=True)))
    assert store.wait_idle(10)
    assert redis.contains(ns, h) == [True] * 4
    assert host.contains(ns, h) == [False, False, True, True]
    assert disk.contains(ns, h) == [True, True, False, False]  # host evictions still spill to disk
    assert redis.stats.blocks_written == 4  # written once, not again on spill
    store.close()


def test_lower_tier_hits_are_promoted_into_host(
    tmp_path: Path, redis_server: RedisServer, ns: Namespace
) -> None:
    store = all_tiers(tmp_path, redis_server.url)
    host, disk, redis = store.tiers
    h = chain(ns, 4)
    disk.put(ns, encoded(h[:2]))
    redis.put(ns, encoded(h[2:], seed=2))
    assert store.load_prefix(ns, h).tiers == ["disk", "disk", "redis", "redis"]
    assert store.wait_idle(10)
    assert host.contains(ns, h) == [True] * 4
    assert store.load_prefix(ns, h).tiers == ["host"] * 4
    store.close()


def test_store_copies_the_block_before_returning(tmp_path: Path, ns: Namespace) -> None:
    store = TieredStore(TierConfig(host_bytes=10 * VALUE_BYTES))
    pool = torch.stack(blocks(3), dim=2)  # [layers, 2, num_blocks, bs, heads, dim]
    expected = pool[:, :, 1].clone()
    (h,) = chain(ns, 1)
    store.store(ns, [(h, pool[:, :, 1])])
    pool.zero_()  # the device block is reused at once
    assert store.wait_idle(10)
    assert torch.equal(store.load_prefix(ns, [h]).blocks[0], expected)
    store.close()


def test_namespaces_isolated_through_the_store(
    tmp_path: Path, redis_server: RedisServer, ns: Namespace
) -> None:
    store = all_tiers(tmp_path, redis_server.url, host=1, disk=1)
    h = chain(ns, 3)
    store.store(ns, list(zip(h, blocks(3), strict=True)))
    assert store.wait_idle(10)
    assert store.locate(ns, h) == ["redis", "disk", "host"]
    for other in (ns.with_salt("x"), Namespace("other-model", ns.kv_dtype, ns.block_size)):
        assert store.load_prefix(other, h).tiers == []
        assert store.lookup_tokens(other, h) == {"host": 0, "disk": 0, "redis": 0}
    store.close()


def test_corrupt_disk_block_cuts_the_run_and_is_counted(tmp_path: Path, ns: Namespace) -> None:
    store = TieredStore(TierConfig(disk_path=tmp_path, disk_bytes=100 * VALUE_BYTES))
    (disk,) = store.tiers
    assert isinstance(disk, DiskTier)
    h = chain(ns, 4)
    disk.put(ns, encoded(h))
    path = disk.path_of(ns, h[2])
    data = bytearray(path.read_bytes())
    data[HEADER_SIZE + 5] ^= 1
    path.write_bytes(bytes(data))
    assert store.load_prefix(ns, h).tiers == ["disk", "disk"]
    assert disk.stats.corrupt == 1 and disk.stats.hits == 2
    assert disk.contains(ns, h) == [True, True, False, True]
    store.close()


def test_wrong_dtype_for_the_namespace_is_rejected(tmp_path: Path, ns: Namespace) -> None:
    store = TieredStore(TierConfig(host_bytes=10 * VALUE_BYTES))
    h = chain(ns, 2)
    store.tiers[0].put(
        ns,
        [(h[0], encode_block(make_block(0))), (h[1], encode_block(make_block(1, torch.float32)))],
    )
    assert store.load_prefix(ns, h).tiers == ["host"]  # ns.kv_dtype is bfloat16
    assert store.tiers[0].stats.corrupt == 1
    store.close()


def test_deadline_returns_in_time_then_recovers(
    tmp_path: Path, redis_server: RedisServer, ns: Namespace
) -> None:
    store = all_tiers(tmp_path, redis_server.url, deadline_s=0.1, redis_timeout_s=5.0)
    h = chain(ns, 4)
    store.tiers[2].put(ns, encoded(h))
    admin = redis_server.client()
    admin.client_pause(600)  # Redis stalls every client for 0.6 s: a slow tier
    start = time.perf_counter()
    result = store.load_prefix(ns, h)
    elapsed = time.perf_counter() - start
    assert result.tiers == [] and elapsed < 0.4
    assert store.store_stats.deadline_misses == 1
    assert store.load_prefix(ns, h, deadline_s=5.0).tiers == ["redis"] * 4
    store.close()


def test_full_writer_queue_drops_and_counts(
    tmp_path: Path, redis_server: RedisServer, ns: Namespace
) -> None:
    cfg = TierConfig(redis_url=redis_server.url, queue_blocks=4, redis_timeout_s=5.0)
    store = TieredStore(cfg)
    admin = redis_server.client()
    admin.client_pause(3000, all=False)  # writes stall: the writer thread blocks on its SET
    h = chain(ns, 6)
    store.store(ns, list(zip(h[:4], blocks(4), strict=True)))
    store.store(ns, list(zip(h[4:], blocks(2), strict=True)))  # queue holds 4 blocks: dropped
    assert store.store_stats.dropped_blocks == 2 and store.store_stats.stored_blocks == 4
    admin.client_unpause()
    assert store.wait_idle(10)
    assert store.tiers[0].contains(ns, h) == [True] * 4 + [False] * 2
    store.close()


def test_redis_killed_mid_workload(
    tmp_path: Path, redis_server: RedisServer, ns: Namespace
) -> None:
    store = all_tiers(tmp_path, redis_server.url, host=2, disk=2, redis_cooldown_s=0.0)
    h = chain(ns, 6)
    store.store(ns, list(zip(h, blocks(6), strict=True)))
    assert store.wait_idle(10)
    redis_server.kill()
    # the first two blocks lived only in Redis: the run is empty, nothing raises
    assert store.load_prefix(ns, h).tiers == []
    assert store.tiers[2].stats.errors >= 1
    store.store(ns, list(zip(chain(ns, 4, start=1000), blocks(4), strict=True)))
    assert store.wait_idle(10)  # spills into the dead Redis are refused and counted
    assert store.tiers[2].stats.rejected_writes >= 1
    redis_server.start()
    store.store(ns, list(zip(h[:2], blocks(2), strict=True)))
    assert store.wait_idle(10)
    assert store.load_prefix(ns, h).tiers[:2] == ["host", "host"]
    store.close()


@pytest.mark.parametrize("policy", ["write-back", "write-through"])
def test_config_validation_and_enabled(policy: str) -> None:
    assert not TierConfig(write_policy=policy).enabled  # type: ignore[arg-type]
    assert TierConfig(host_bytes=1, write_policy=policy).enabled  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TierConfig(write_policy="sometimes")  # type: ignore[arg-type]


def test_publish_writes_computed_blocks_to_redis_only_when_write_through(
    tmp_path: Path, redis_server: RedisServer, ns: Namespace
) -> None:
    back = all_tiers(tmp_path / "a", redis_server.url)
    assert not back.write_through
    h = chain(ns, 3)
    back.publish(ns, list(zip(h, blocks(3), strict=True)))
    assert back.wait_idle(10) and back.store_stats.stored_blocks == 0
    through = all_tiers(tmp_path / "b", redis_server.url, write_policy="write-through")
    assert through.write_through
    through.publish(ns, list(zip(h, blocks(3), strict=True)))
    assert through.wait_idle(10)
    host, _, redis = through.tiers
    assert redis.contains(ns, h) == [True] * 3 and host.contains(ns, h) == [False] * 3
    through.store(ns, list(zip(h, blocks(3), strict=True)))  # evicted later: not sent again
    assert through.wait_idle(10)
    assert redis.stats.blocks_written == 3 and host.contains(ns, h) == [True] * 3
    back.close()
    through.close()


@pytest.mark.parametrize("kv_dtype", ["int8", "bfloat16@fp8_e4m3"])
def test_packed_blocks_go_down_and_come_back_bit_for_bit(tmp_path: Path, kv_dtype: str) -> None:
    """A namespace whose kv_dtype names a quantized format: the writer tags its uint8 blocks with
    it, the loader accepts only that format; the budgets count the encoded bytes."""
    ns = Namespace(model_id="tiny-test-model", kv_dtype=kv_dtype, block_size=4)
    shape = (*BLOCK_SHAPE[:-1], BLOCK_SHAPE[-1] + 4)
    gen = torch.Generator().manual_seed(0)
    kv = [torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8) for _ in range(4)]
    value_bytes = HEADER_SIZE + kv[0].numel()
    cfg = TierConfig(host_bytes=2 * value_bytes, disk_path=tmp_path / "disk")
    store = TieredStore(cfg)
    h = chain(ns, 4)
    store.store(ns, list(zip(h, kv, strict=True)))
    assert store.wait_idle(10)
    host, disk = store.tiers
    assert host.used_bytes() == 2 * value_bytes and disk.used_bytes() == 2 * value_bytes
    result = store.load_prefix(ns, h, shape=shape)
    assert result.tiers == ["disk", "disk", "host", "host"]
    assert all(torch.equal(a, b) for a, b in zip(result.blocks, kv, strict=True))
    other = Namespace(model_id="tiny-test-model", kv_dtype="fp8_e5m2", block_size=4)
    disk.put(other, [(h[0], encode_block(kv[0], "int8"))])  # another format under its key
    assert store.load_prefix(other, h[:1]).tiers == []
    assert disk.stats.corrupt == 1
    store.close()
