"""RedisTier: encoded blocks in a (shared) Redis, keyed `<prefix>:<namespace hex>:<hash hex>`.

redis-py connection pool with short socket timeouts and no retries; batch calls are one MGET or
one non-transactional pipeline. Circuit breaker: any connection error or timeout takes the tier out
of service for `cooldown_s` (calls return misses at once, writes are dropped and counted); the
first call after the cool-down tries Redis again and closes the breaker if it succeeds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from storage.base import EvictCallback, TierStats, block_key
from storage.codec import CorruptBlock, verify_block

if TYPE_CHECKING:
    from radixcache.hashing import Namespace

T = TypeVar("T")
_FAILURES = (redis.RedisError, OSError)


class RedisTier:
    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "radixcache",
        ttl_s: int | None = 24 * 3600,
        socket_timeout_s: float = 0.25,
        cooldown_s: float = 5.0,
        max_connections: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.cooldown_s = cooldown_s
        self.on_evict: EvictCallback | None = None  # Redis expires by TTL / its own maxmemory
        self.stats = TierStats()
        self.open_until = float("-inf")  # breaker open (tier skipped) while clock() < open_until
        self._clock = clock
        self._pool = redis.ConnectionPool.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            max_connections=max_connections,
            retry=Retry(NoBackoff(), 0),
        )
        self._client = redis.Redis(connection_pool=self._pool)

    def available(self) -> bool:
        return self._clock() >= self.open_until

    def key(self, ns: Namespace, block_hash: int) -> str:
        return f"{self.prefix}:{block_key(ns, block_hash)}"

    # --- Tier interface ---
    def contains(self, ns: Namespace, hashes: list[int]) -> list[bool]:
        if not hashes:
            return []

        def run() -> list[bool]:
            pipe = self._client.pipeline(transaction=False)
            for h in hashes:
                pipe.exists(self.key(ns, h))
            return [bool(n) for n in pipe.execute()]

        return self._guarded(run, [False] * len(hashes))

    def get(self, ns: Namespace, hashes: list[int]) -> list[bytes | None]:
        if not hashes:
            return []
        values = self._guarded(lambda: self._client.mget([self.key(ns, h) for h in hashes]), None)
        if values is None:
            return [None] * len(hashes)
        out: list[bytes | None] = []
        bad = []
        for h, value in zip(hashes, values, strict=True):
            if value is not None:
                self.stats.bytes_read += len(value)
                try:
                    verify_block(value)
                except CorruptBlock:
                    self.stats.corrupt += 1
                    bad.append(h)
                    value = None
            out.append(value)
        if bad:
            self.delete(ns, bad)
        return out

    def put(self, ns: Namespace, items: list[tuple[int, bytes]]) -> None:
        if not items:
            return

        def run() -> bool:
            pipe = self._client.pipeline(transaction=False)
            for h, value in items:
                pipe.set(self.key(ns, h), value, ex=self.ttl_s)
            pipe.execute()
            return True

        if self._guarded(run, False):
            self.stats.bytes_written += sum(len(v) for _, v in items)
            self.stats.blocks_written += len(items)
        else:
            self.stats.rejected_writes += len(items)

    def delete(self, ns: Namespace, hashes: list[int]) -> None:
        if hashes:
            self._guarded(lambda: self._client.delete(*[self.key(ns, h) for h in hashes]), 0)

    def used_bytes(self) -> int:
        return 0  # Redis manages its own memory (maxmemory / TTL)

    def close(self) -> None:
        self._pool.disconnect()

    # --- circuit breaker ---
    def _guarded(self, call: Callable[[], T], default: T) -> T:
        if not self.available():
            self.stats.skipped_calls += 1
            return default
        try:
            return call()
        except _FAILURES:
            self.stats.errors += 1
            self.stats.breaker_opens += 1
            self.open_until = self._clock() + self.cooldown_s
            self._pool.disconnect()
            return default
