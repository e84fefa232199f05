"""RedisResponseStore: stored responses in a (shared) Redis or Redis Cluster, so that every replica
behind a router finds a conversation whichever replica answered its earlier turns.

Keys: `{radixcache-responses}:r:<id>` holds one record (JSON) with EX ttl_s; the sorted set
`{radixcache-responses}:index` holds every id by the time it was written, trimmed to
max_responses (the oldest dropped first, their records deleted with them). The braces are a hash
tag: a cluster keeps all of the store's keys in one slot, so each call is one MULTI/EXEC on one
node; and no key of the KV tier (`radixcache:<namespace>:<hash>`) starts with a brace.

The URL is the KV tier's (storage.redis_nodes: `redis://` one server, `redis+cluster://` a
cluster). A failure (down, timeout, an error reply) raises ResponseStoreUnavailable, a 503
ApiError; a MOVED reply rereads the cluster's topology and is tried once more.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from redis.exceptions import MovedError

from api.errors import ApiError
from api.openai.responses.store import StoredResponse
from storage.redis_nodes import FAILURES, RedisNodes, open_nodes, redacted_url

KEY_PREFIX = "{radixcache-responses}"


class ResponseStoreUnavailable(ApiError):
    """The store could not be reached or failed: the request gets a 503 (an ApiError, so any
    route that meets it answers one), the server goes on."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message, code="store_unavailable")


class RedisResponseStore:
    def __init__(
        self,
        url: str,
        max_responses: int,
        ttl_s: float,
        *,
        socket_timeout_s: float = 1.0,
        max_connections: int = 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_responses < 1 or ttl_s <= 0:
            raise ValueError("a response store needs max_responses >= 1 and ttl_s > 0")
        self.url = url
        self.max_responses = max_responses
        self.ttl_s = ttl_s
        self.index_key = f"{KEY_PREFIX}:index"
        self._clock = clock
        self._nodes: RedisNodes = open_nodes(
            url, timeout_s=socket_timeout_s, max_connections=max_connections
        )

    def record_key(self, response_id: str) -> str:
        return f"{KEY_PREFIX}:r:{response_id}"

    def put(self, record: StoredResponse) -> None:
        now = self._clock()
        value = json.dumps(asdict(record), separators=(",", ":"))
        ttl_ms = max(1, round(self.ttl_s * 1000))

        def write(pipe: Any) -> None:
            pipe.set(self.record_key(record.id), value, px=ttl_ms)
            pipe.zadd(self.index_key, {record.id: now})
            pipe.zremrangebyscore(self.index_key, "-inf", f"({now - self.ttl_s}")  # expired
            pipe.expire(self.index_key, ttl_ms // 1000 + 1)  # the index outlives no record
            pipe.zcard(self.index_key)

        *_, count = self._transaction(write)
        if count > self.max_responses:
            self._trim(count - self.max_responses)

    def _trim(self, excess: int) -> None:
        """Drops the `excess` oldest ids and their records (ZPOPMIN: two concurrent writers never
        drop the same id; together they may drop a few more than the bound asks)."""
        popped = self._transaction(lambda pipe: pipe.zpopmin(self.index_key, excess))[0]
        ids = [rid.decode() if isinstance(rid, bytes) else rid for rid, _ in popped]
        if ids:
            self._transaction(lambda pipe: pipe.delete(*map(self.record_key, ids)))

    def get(self, response_id: str) -> StoredResponse | None:
        (raw,) = self._transaction(lambda pipe: pipe.get(self.record_key(response_id)))
        if raw is None:
            return None
        return StoredResponse(**json.loads(raw))

    def delete(self, response_id: str) -> bool:
        def remove(pipe: Any) -> None:
            pipe.delete(self.record_key(response_id))
            pipe.zrem(self.index_key, response_id)

        deleted, _ = self._transaction(remove)
        return deleted > 0

    def close(self) -> None:
        self._nodes.close()

    def _transaction(self, commands: Callable[[Any], None]) -> list[Any]:
        """One MULTI/EXEC on the node that serves the store's slot; a MOVED (the slot moved in a
        failover or a resharding) rereads the topology and tries once more."""
        for attempt in (0, 1):
            try:
                (node,) = self._nodes.route([self.index_key])
                pipe = self._nodes.client(node).pipeline(transaction=True)
                commands(pipe)
                return pipe.execute()
            except MovedError:
                self._refresh()
                if attempt:
                    break
            except FAILURES as exc:
                self._refresh()
                raise ResponseStoreUnavailable(
                    f"the response store at {redacted_url(self.url)} failed: {exc}"
                ) from exc
        raise ResponseStoreUnavailable(f"the response store at {redacted_url(self.url)} moved")

    def _refresh(self) -> None:
        """Drops the sockets a restart reset / rereads the slot map, for the next call."""
        with contextlib.suppress(*FAILURES):  # still down: the next call fails again
            self._nodes.refresh()
