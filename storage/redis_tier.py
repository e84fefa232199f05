"""RedisTier: encoded blocks in a (shared) Redis or Redis Cluster, keyed
`<prefix>:<namespace hex>:<hash hex>`.

The URL picks where keys live (storage.redis_nodes): `redis://` one server, `redis+cluster://` the
masters of a cluster. Either way a batch call is one non-transactional pipeline per node involved
(one MGET per hash slot for reads), the nodes served concurrently, so a load-back of N blocks
costs one round trip per node, not N.

Keys carry no hash tag: each block hashes to its own slot, so a cluster's memory and traffic
spread evenly over the masters, and a prefix every replica reads (a shared system prompt) does
not make one node hot. The price is that a long prefix touches every master, so a dead master
cuts the leading run of found blocks at its first block (docs/redis-cluster.md measures both).

Faults, per node: a connection error, timeout or error reply takes that node out of service for
`cooldown_s` (circuit breaker): its reads are misses, its writes are dropped and counted, the other
nodes keep serving. When the cool-down is over the topology is reread (a failover may have moved
its slots) and the node is tried again. MOVED / ASK replies reread the topology and retry those
keys once. Nothing is retried inside a call, so no call waits longer than the socket timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import redis
from redis.client import Pipeline
from redis.exceptions import AskError, MovedError, RedisClusterException

from storage.base import EvictCallback, TierStats, block_key
from storage.codec import CorruptBlock, verify_block
from storage.redis_nodes import RedisNodes, open_nodes

if TYPE_CHECKING:
    from radixcache.hashing import Namespace

_FAILURES = (redis.RedisError, RedisClusterException, OSError)  # the latter: no topology
_MISSING = object()  # a key whose node was down or failed: a miss, a dropped write
Queue = Callable[[Pipeline, list[str]], None]  # queues the command(s) of one slot group


@dataclass
class NodeHealth:
    """Counters of one Redis node (a cluster master, or the one server)."""

    up: bool = True  # False from a failure until a later call to the node succeeds
    errors: int = 0  # connection errors, timeouts, error replies
    breaker_opens: int = 0
    skipped_calls: int = 0  # calls that left this node out while it cooled down
    rejected_writes: int = 0  # blocks not written: node down or failing
    redirects: int = 0  # MOVED / ASK replies (slots moved: the topology was reread)
    blocks_read: int = 0
    blocks_written: int = 0
    open_until: float = float("-inf")  # breaker open (node skipped) while clock() < open_until

    def snapshot(self) -> dict[str, float]:
        out = asdict(self)
        out["up"] = int(self.up)
        del out["open_until"]
        return out


@dataclass
class RedisStats(TierStats):
    """The tier's counters plus per-node health; `nodes` is keyed by "host:port"."""

    topology_refreshes: int = 0
    nodes: dict[str, NodeHealth] = field(default_factory=dict)

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in asdict(self).items() if k != "nodes"}
        out["nodes"] = {name: h.snapshot() for name, h in sorted(self.nodes.items())}
        out["nodes_up"] = sum(h.up for h in self.nodes.values())
        out["nodes_down"] = len(self.nodes) - out["nodes_up"]
        return out


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
        self.stats = RedisStats()
        self.open_until = float("-inf")  # whole tier skipped: the topology could not be read
        self._clock = clock
        self._nodes: RedisNodes = open_nodes(
            url, timeout_s=socket_timeout_s, max_connections=max_connections
        )
        self._refresh_due = False  # a node failed: reread the topology before trying it again
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="redis-node")
        self._track(self._nodes.names())

    def available(self) -> bool:
        """False while the tier or every node it knows cools down after a failure."""
        now = self._clock()
        nodes = self.stats.nodes.values()
        in_service = not nodes or any(h.up or now >= h.open_until for h in nodes)
        return now >= self.open_until and in_service

    def key(self, ns: Namespace, block_hash: int) -> str:
        return f"{self.prefix}:{block_key(ns, block_hash)}"

    # --- Tier interface ---
    def contains(self, ns: Namespace, hashes: list[int]) -> list[bool]:
        keys = [self.key(ns, h) for h in hashes]
        replies = self._fan_out(keys, lambda p, ks: p.exists(ks[0]), grouped=False, write=False)
        return [r is not _MISSING and bool(r) for r in replies]

    def get(self, ns: Namespace, hashes: list[int]) -> list[bytes | None]:
        keys = [self.key(ns, h) for h in hashes]
        replies = self._fan_out(keys, lambda p, ks: p.mget(ks), grouped=True, write=False)
        out: list[bytes | None] = []
        bad = []
        for h, value in zip(hashes, replies, strict=True):
            if value is _MISSING or value is None:
                out.append(None)
                continue
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
        values = {self.key(ns, h): v for h, v in items}
        keys = list(values)

        def queue(pipe: Pipeline, ks: list[str]) -> None:
            pipe.set(ks[0], values[ks[0]], ex=self.ttl_s)

        replies = self._fan_out(keys, queue, grouped=False, write=True)
        for key, reply in zip(keys, replies, strict=True):
            if reply is _MISSING:
                self.stats.rejected_writes += 1
            else:
                self.stats.bytes_written += len(values[key])
                self.stats.blocks_written += 1

    def delete(self, ns: Namespace, hashes: list[int]) -> None:
        keys = [self.key(ns, h) for h in hashes]
        self._fan_out(keys, lambda p, ks: p.delete(ks[0]), grouped=False, write=False)

    def used_bytes(self) -> int:
        return 0  # Redis manages its own memory (maxmemory / TTL)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._nodes.close()

    # --- one pipeline per node ---
    def _fan_out(
        self, keys: list[str], queue: Queue, *, grouped: bool, write: bool, retry: bool = True
    ) -> list[Any]:
        """Each key's reply (an MGET group's replies spread over its keys), or _MISSING where the
        key's node was skipped or failed."""
        out: list[Any] = [_MISSING] * len(keys)
        if not keys:
            return out
        routes = self._routes(keys, write)
        if not grouped:  # one command per key
            routes = {node: [[i] for g in groups for i in g] for node, groups in routes.items()}
        if not routes:
            return out
        replies = self._run_pipelines(routes, keys, queue)
        redirected: list[int] = []
        for node, groups in routes.items():
            health, reply = self.stats.nodes[node], replies[node]
            if isinstance(reply, BaseException):
                reply = [reply] * len(groups)
            failed = 0  # keys of this node whose command failed
            for group, result in zip(groups, reply, strict=True):
                if isinstance(result, (MovedError, AskError)):
                    health.redirects += 1
                    redirected += group
                elif isinstance(result, BaseException):
                    failed += len(group)
                else:
                    for i, value in zip(group, result if grouped else [result], strict=True):
                        out[i] = value
                    health.blocks_written += len(group) if write else 0
                    health.blocks_read += sum(v is not None for v in result) if grouped else 0
            if failed:
                self._node_failed(health)
                health.rejected_writes += failed if write else 0
            else:
                health.up = True
        if redirected and retry and self._refresh():
            again = self._fan_out(
                [keys[i] for i in redirected], queue, grouped=grouped, write=write, retry=False
            )
            for i, value in zip(redirected, again, strict=True):
                out[i] = value
        return out

    def _routes(self, keys: list[str], write: bool) -> dict[str, list[list[int]]]:
        """Slot groups per node still in service (skipped nodes counted on the node; the caller
        counts what was not written); {} if the topology could not be read."""
        now = self._clock()
        if now < self.open_until:
            self.stats.skipped_calls += 1
            return {}
        half_open = any(not h.up and now >= h.open_until for h in self.stats.nodes.values())
        if self._refresh_due and half_open and not self._refresh():
            return {}  # half-open: reread the topology first (a failover may have moved slots)
        try:
            routes = self._nodes.route(keys)
        except _FAILURES:
            self._tier_failed()
            return {}
        self._track(routes)
        skipped = False
        for node in list(routes):
            health = self.stats.nodes[node]
            if not health.up and now < health.open_until:
                skipped = True
                health.skipped_calls += 1
                health.rejected_writes += sum(map(len, routes[node])) if write else 0
                del routes[node]
        self.stats.skipped_calls += skipped
        return routes

    def _run_pipelines(
        self, routes: dict[str, list[list[int]]], keys: list[str], queue: Queue
    ) -> dict[str, list[Any] | BaseException]:
        """Sends each node its pipeline, nodes concurrently (the first on this thread)."""

        def run(node: str) -> list[Any] | BaseException:
            try:
                pipe = self._nodes.client(node).pipeline(transaction=False)
                for group in routes[node]:
                    queue(pipe, [keys[i] for i in group])
                return pipe.execute(raise_on_error=False)
            except _FAILURES as exc:
                return exc

        nodes = list(routes)
        futures = {node: self._pool.submit(run, node) for node in nodes[1:]}
        out = {nodes[0]: run(nodes[0])}
        for node, future in futures.items():
            out[node] = future.result()
        return out

    # --- circuit breakers and topology ---
    def _track(self, nodes: object) -> None:
        for node in nodes:  # names, or the keys of a routes dict
            if node not in self.stats.nodes:
                self.stats.nodes[node] = NodeHealth()

    def _node_failed(self, health: NodeHealth) -> None:
        self.stats.errors += 1
        health.errors += 1
        if health.up or self._clock() >= health.open_until:
            self.stats.breaker_opens += 1
            health.breaker_opens += 1
        health.up = False
        health.open_until = self._clock() + self.cooldown_s
        self._refresh_due = True

    def _tier_failed(self) -> None:
        self.stats.errors += 1
        self.stats.breaker_opens += 1
        self.open_until = self._clock() + self.cooldown_s

    def _refresh(self) -> bool:
        self._refresh_due = False
        self.stats.topology_refreshes += 1
        try:
            self._nodes.refresh()
        except _FAILURES:
            self._tier_failed()
            return False
        names = self._nodes.names()
        self._track(names)
        for gone in set(self.stats.nodes) - set(names):
            if not self.stats.nodes[gone].up:  # failed over: its slots are served elsewhere
                del self.stats.nodes[gone]
        return True
