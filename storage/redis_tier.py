"""RedisTier: encoded blocks in a (shared) Redis or Redis Cluster, keyed
`<prefix>:<namespace hex>:<hash hex>`.

The URL picks where keys live (storage.redis_nodes): `redis://` one server, `redis+cluster://` the
masters of a cluster. Either way a batch call is one pipeline per node involved (one MGET per hash
slot for reads), every node's commands written before any reply is read, so a load-back of N
blocks costs one round trip per node, the nodes working concurrently, not N.

Keys carry no hash tag: each block hashes to its own slot, so a cluster's memory and traffic
spread evenly over the masters, and a prefix every replica reads (a shared system prompt) does
not make one node hot. The price: a long prefix touches every master, so a dead master would cut
the leading run of found blocks at its first block. Hence the hand-off below.

Faults, per node: a connection error, timeout or error reply takes that node out of service for
`cooldown_s` (circuit breaker); its blocks in that call are misses / dropped writes, counted. While
it is out, its blocks are read from and written to a stand-in key `<key>~<n>` on the first live
node (n = 1, 2, ...): a block recomputed meanwhile is stored, and found again, there (values are
content-addressed and checksummed, so any copy is as good as the original). After the cool-down the
topology is reread (a failover may have moved its slots) and the node is tried again; stand-ins
then expire by TTL / maxmemory. MOVED / ASK replies reread the topology and retry those keys once.
Nothing else is retried, so no call waits longer than the socket timeout.

Retention (`retain`, a request's prompt_cache_retention, when Redis is the persistent tier): the
key is set with the retention's expiry (24 h; none when the ordinary --redis-ttl is none), and
ordinary writes of a retained key are skipped so they cannot cut it short. Past the ledger's byte
budget (storage/retention.py, this process's grants) the oldest retained keys get the ordinary TTL
back; a retention that runs its time ends with the key (Redis expires it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import AskError, MovedError

from radixcache.shared.tier_names import TierName
from storage.base import SpillDown, block_key
from storage.codec import CorruptBlock, verify_block
from storage.redis_health import NodeHealth, RedisStats
from storage.redis_nodes import (
    FAILURES,
    Command,
    RedisNodes,
    Routes,
    open_nodes,
    send_and_read,
)
from storage.retention import RETAIN_S, RetentionLedger, RetentionStats

if TYPE_CHECKING:
    from radixcache.hashing import Namespace

__all__ = ["NodeHealth", "RedisStats", "RedisTier"]

_MISSING = object()  # a key whose node was down or failed: a miss, a dropped write
HANDOFF_TRIES = 8  # stand-in keys tried for a block whose node is down


class RedisTier:
    name = TierName.REDIS

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
        retained_bytes: int = 0,
        retain_s: int = RETAIN_S,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.cooldown_s = cooldown_s
        self.spill_down: SpillDown | None = None  # Redis expires by TTL / its own maxmemory
        self.stats = RedisStats()
        self.open_until = float("-inf")  # whole tier skipped: the topology could not be read
        self._clock = clock
        self.retention: RetentionLedger[str] = RetentionLedger(retained_bytes, retain_s, clock)
        self._nodes: RedisNodes = open_nodes(
            url, timeout_s=socket_timeout_s, max_connections=max_connections
        )
        self._refresh_due = False  # a node failed: reread the topology before trying it again
        self._track(self._nodes.names())

    def available(self) -> bool:
        """False while the tier or every node it knows cools down after a failure."""
        now = self._clock()
        nodes = list(self.stats.nodes.values())
        in_service = not nodes or any(self._in_service(h, now) for h in nodes)
        return now >= self.open_until and in_service

    def key(self, ns: Namespace, block_hash: int) -> str:
        return f"{self.prefix}:{block_key(ns, block_hash)}"

    # --- Tier interface ---
    def contains(self, ns: Namespace, hashes: list[int]) -> list[bool]:
        keys = [self.key(ns, h) for h in hashes]
        replies = self._fan_out(keys, lambda ks, _: ("EXISTS", ks[0]), grouped=False, write=False)
        return [r is not _MISSING and bool(r) for r in replies]

    def get(self, ns: Namespace, hashes: list[int]) -> list[bytes | None]:
        keys = [self.key(ns, h) for h in hashes]
        replies = self._fan_out(keys, lambda ks, _: ("MGET", *ks), grouped=True, write=False)
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
        if len(self.retention):  # a retained key keeps its longer expiry
            self.retention.expire()
            items = [(h, v) for h, v in items if self.key(ns, h) not in self.retention]
        self._set(ns, items, self.ttl_s)

    def retain(self, ns: Namespace, items: list[tuple[int, bytes]]) -> None:
        """Sets a prefix's blocks (in prefix order) with the retention's expiry, and retains
        them (see the module's docstring)."""
        self.retention.expire()  # Redis ends those keys itself, at the same time
        longest = None if self.ttl_s is None else max(self.ttl_s, int(self.retention.duration_s))
        written = self._set(ns, items, longest)
        prefix = []
        for (h, value), ok in zip(items, written, strict=True):
            if not ok:
                break  # blocks chain: what follows a missing block cannot be loaded
            prefix.append((self.key(ns, h), len(value)))
        dropped = [key for key, _ in self.retention.grant(prefix)]
        if dropped and self.ttl_s is not None:  # back to an ordinary key's expiry
            ttl = self.ttl_s
            self._fan_out(dropped, lambda ks, _: ("EXPIRE", ks[0], ttl), grouped=False, write=True)

    def retention_stats(self) -> RetentionStats:
        self.retention.expire()
        return self.retention.snapshot()

    def _set(self, ns: Namespace, items: list[tuple[int, bytes]], ttl_s: int | None) -> list[bool]:
        """SET each item (EX ttl_s unless None); whether each was written."""
        keys = [self.key(ns, h) for h, _ in items]
        values = [v for _, v in items]
        expiry = () if ttl_s is None else ("EX", ttl_s)
        replies = self._fan_out(
            keys, lambda ks, ix: ("SET", ks[0], values[ix[0]], *expiry), grouped=False, write=True
        )
        for value, reply in zip(values, replies, strict=True):
            if reply is _MISSING:
                self.stats.rejected_writes += 1
            else:
                self.stats.bytes_written += len(value)
                self.stats.blocks_written += 1
        return [reply is not _MISSING for reply in replies]

    def delete(self, ns: Namespace, hashes: list[int]) -> None:
        keys = [self.key(ns, h) for h in hashes]
        for key in keys:
            self.retention.release(key)
        self._fan_out(keys, lambda ks, _: ("DEL", ks[0]), grouped=False, write=False)

    def used_bytes(self) -> int:
        return 0  # Redis manages its own memory (maxmemory / TTL)

    def close(self) -> None:
        self._nodes.close()

    # --- one pipeline per node ---
    def _fan_out(self, keys: list[str], command: Command, *, grouped: bool, write: bool) -> list:
        """Each key's reply (an MGET group's replies spread over its keys), or _MISSING where the
        key's node failed (or was down and no stand-in node was found)."""
        out: list[Any] = [_MISSING] * len(keys)
        sent = list(keys)  # the key sent for each block: its own, or a stand-in (hand-off)
        pending = list(range(len(keys)))
        failed: dict[str, list[int]] = {}
        for attempt in range(2):  # again for keys redirected (MOVED / ASK) or of a failed node
            routes = self._routes(sent, pending, write, failed) if pending else {}
            if not grouped:  # one command per key
                routes = {node: [[i] for g in groups for i in g] for node, groups in routes.items()}
            if not routes:
                break
            replies = send_and_read(self._nodes, routes, sent, command)
            redirected, failed = self._collect(routes, replies, out, grouped=grouped, write=write)
            pending = redirected + [i for ix in failed.values() for i in ix]
            if not pending or attempt or (redirected and not self._refresh()):
                break
        return out

    def _collect(
        self, routes: Routes, replies: dict, out: list, *, grouped: bool, write: bool
    ) -> tuple[list[int], dict[str, list[int]]]:
        """Spreads each node's replies over `out`, counts per node; returns the redirected key
        indices and the key indices of each node that failed."""
        redirected: list[int] = []
        failed_nodes: dict[str, list[int]] = {}
        for node, groups in routes.items():
            health, reply = self._health(node), replies[node]
            if isinstance(reply, BaseException):
                reply = [reply] * len(groups)
            failed: list[int] = []  # keys of this node whose command failed
            for group, result in zip(groups, reply, strict=True):
                if isinstance(result, (MovedError, AskError)):
                    health.redirects += 1
                    redirected += group
                elif isinstance(result, BaseException):
                    failed += group
                else:
                    for i, value in zip(group, result if grouped else [result], strict=True):
                        out[i] = value
                    health.blocks_written += len(group) if write else 0
                    health.blocks_read += sum(v is not None for v in result) if grouped else 0
            if failed:
                self._node_failed(health)
                health.rejected_writes += len(failed) if write else 0
                failed_nodes[node] = failed
            else:
                health.up = True
        return redirected, failed_nodes

    def _routes(
        self, sent: list[str], indices: list[int], write: bool, failed: dict[str, list[int]]
    ) -> Routes:
        """Slot groups per node in service for the keys `indices`; keys of nodes cooling down,
        or `failed` earlier in this call, are handed off to stand-ins. {} if the topology could
        not be read."""
        now = self._clock()
        if now < self.open_until:
            self.stats.skipped_calls += 1
            return {}
        half_open = any(self._half_open(h, now) for h in list(self.stats.nodes.values()))
        if self._refresh_due and half_open and not failed and not self._refresh():
            return {}  # half-open: reread first, a failover may have moved the node's slots
        try:
            routes = self._route(sent, indices)
        except FAILURES:
            self._tier_failed()
            return {}
        out = set(failed) | {n for n in routes if not self._in_service(self._health(n), now)}
        skipped = False
        for node in out & set(routes):
            health = self._health(node)
            keys = [i for g in routes.pop(node) for i in g]
            if node not in failed:  # (a failed node's keys were counted when it failed)
                skipped = True
                health.skipped_calls += 1
                health.rejected_writes += len(keys) if write else 0
            handed = self._hand_off(sent, keys, routes, now, out)
            health.handed_off += handed if write else 0
        self.stats.skipped_calls += skipped
        return routes

    def _route(self, sent: list[str], indices: list[int]) -> Routes:
        local = self._nodes.route([sent[i] for i in indices])
        self._track(local)
        return {node: [[indices[j] for j in g] for g in groups] for node, groups in local.items()}

    def _hand_off(
        self, sent: list[str], indices: list[int], routes: Routes, now: float, out: set[str]
    ) -> int:
        """Points each key at the first stand-in `<key>~<n>` on a node in service and not in
        `out` (one group each, added to `routes`); how many found one."""
        live = {n for n, h in list(self.stats.nodes.items()) if self._in_service(h, now)} - out
        if not live:
            return 0
        found = 0
        for i in indices:
            for n in range(1, HANDOFF_TRIES + 1):
                stand_in = f"{sent[i]}~{n}"
                try:
                    (node,) = self._nodes.route([stand_in])
                except FAILURES:
                    break
                health = self.stats.nodes.get(node)
                if node in live or (health is None and node not in out):  # unknown: untried
                    self._track([node])
                    sent[i] = stand_in
                    routes.setdefault(node, []).append([i])
                    found += 1
                    break
        return found

    # --- circuit breakers and topology ---
    @staticmethod
    def _in_service(health: NodeHealth, now: float) -> bool:
        return health.up or now >= health.open_until

    @staticmethod
    def _half_open(health: NodeHealth, now: float) -> bool:
        return not health.up and now >= health.open_until

    def _health(self, node: str) -> NodeHealth:
        return self.stats.nodes.setdefault(node, NodeHealth())

    def _track(self, nodes: object) -> None:
        for node in nodes:  # names, or the keys of a routes dict
            self._health(node)

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
        except FAILURES:
            self._tier_failed()
            return False
        names = self._nodes.names()
        self._track(names)
        for gone, health in list(self.stats.nodes.items()):
            if gone not in names and not health.up:  # failed over: slots served elsewhere
                self.stats.nodes.pop(gone, None)
        return True
