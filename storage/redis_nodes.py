"""Where a Redis tier's keys live: one server (`redis://`), or the masters of a Redis Cluster
(`redis+cluster://HOST:PORT[,HOST:PORT...]`, any seed nodes).

RedisTier asks route(keys) for {node name: slot groups (lists of key indices)} and sends one
pipeline per node through client(node) with send_and_read(). One server is one node with one group; a cluster routes
each key by its hash slot through redis-py's RedisCluster, which owns the topology (slot map,
node connections) and rereads it on refresh(). Neither retries: the tier decides what a failure
costs (a miss, a dropped write) and when to try a node again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import Connection
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, ResponseError
from redis.retry import Retry

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")

Routes = dict[str, list[list[int]]]  # node name -> groups of key indices, one hash slot per group
# (keys sent, their indices in the call) of one group -> the command for it
Command = Callable[[list[str], list[int]], tuple]
FAILURES = (redis.RedisError, RedisClusterException, OSError)  # the second: no topology


class RedisNodes(Protocol):
    def route(self, keys: list[str]) -> Routes: ...

    def client(self, node: str) -> redis.Redis: ...

    def names(self) -> list[str]: ...

    def refresh(self) -> None: ...

    def close(self) -> None: ...


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEMES)


def open_nodes(url: str, *, timeout_s: float, max_connections: int) -> RedisNodes:
    if is_cluster_url(url):
        return ClusterNodes(parse_cluster_url(url), timeout_s, max_connections)
    return ServerNodes(url, timeout_s, max_connections)


class ServerNodes:
    """One Redis server: every key on one node, one MGET-able group."""

    def __init__(self, url: str, timeout_s: float, max_connections: int) -> None:
        self._pool = redis.ConnectionPool.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            max_connections=max_connections,
            retry=Retry(NoBackoff(), 0),
        )
        self._client = redis.Redis(connection_pool=self._pool)
        kw = self._pool.connection_kwargs
        self._name = kw.get("path") or f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"

    def route(self, keys: list[str]) -> Routes:
        return {self._name: [list(range(len(keys)))]}

    def client(self, node: str) -> redis.Redis:
        return self._client

    def names(self) -> list[str]:
        return [self._name]

    def refresh(self) -> None:
        self._pool.disconnect()  # drop sockets a restart has reset

    def close(self) -> None:
        self._pool.disconnect()


@dataclass(frozen=True)
class ClusterAddress:
    seeds: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    ssl_options: tuple[tuple[str, str], ...] = ()  # rediss+cluster query options (CA, client cert)


def redacted_url(url: str) -> str:
    """The URL with its password replaced by *** (for banners, logs and errors)."""
    scheme, sep, rest = url.partition("://")
    rest, q, query = rest.partition("?")
    creds, at, hosts = rest.rpartition("@")
    if not sep or not at or ":" not in creds:
        return url
    return f"{scheme}://{creds.split(':', 1)[0]}:***@{hosts}{q}{query}"


# what a TLS cluster URL may say in its query, as redis-py's own rediss:// URLs do
CLUSTER_SSL_OPTIONS = frozenset(
    {"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname"}
)


def parse_cluster_url(url: str) -> ClusterAddress:
    """redis+cluster://[user:password@]host:port[,host:port...][/0]; rediss+cluster:// for TLS,
    which may add ?ssl_ca_certs=PATH (and ssl_certfile, ssl_keyfile, ssl_cert_reqs,
    ssl_check_hostname)."""
    scheme, rest = url.split("://", 1)
    rest, _, query = rest.partition("?")
    rest, _, path = rest.partition("/")
    if path.strip("/") not in ("", "0"):
        raise ValueError(f"{url!r}: a cluster has only database 0")
    ssl = scheme == "rediss+cluster"
    options = tuple(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    unknown = sorted({k for k, _ in options} - (CLUSTER_SSL_OPTIONS if ssl else frozenset()))
    if unknown:
        raise ValueError(f"{redacted_url(url)!r}: unknown query option(s) {unknown}")
    user = password = None
    if "@" in rest:
        auth, rest = rest.rsplit("@", 1)
        user, _, password = auth.partition(":")
        user, password = unquote(user) or None, unquote(password) or None
    seeds = tuple(_host_port(part, url) for part in rest.split(",") if part)
    if not seeds:
        raise ValueError(f"{url!r}: no seed node (redis+cluster://HOST:PORT[,HOST:PORT...])")
    return ClusterAddress(seeds, user, password, ssl=ssl, ssl_options=options)


def _ssl_kwargs(options: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(options)
    if "ssl_check_hostname" in kwargs:
        kwargs["ssl_check_hostname"] = kwargs["ssl_check_hostname"].lower() in ("1", "true", "yes")
    return kwargs


def _host_port(part: str, url: str) -> tuple[str, int]:
    """host:port, [ipv6]:port, or a bare host (port 6379)."""
    if part.startswith("["):
        host, _, tail = part[1:].partition("]")
        port = tail.removeprefix(":") or "6379"
    elif ":" in part:
        host, _, port = part.partition(":")
    else:
        host, port = part, "6379"
    if not host or not port.isdigit():
        raise ValueError(f"{url!r}: bad node address {part!r}")
    return host, int(port)


class ClusterNodes:
    """The masters of a Redis Cluster, by hash slot. The RedisCluster client is made on first use,
    so a cluster that is down when the engine starts costs misses, not a failed start."""

    def __init__(self, address: ClusterAddress, timeout_s: float, max_connections: int) -> None:
        self.address = address
        self._kwargs = {
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            "max_connections": max_connections,
            "username": address.username,
            "password": address.password,
            "ssl": address.ssl,
            **_ssl_kwargs(address.ssl_options),
        }
        self._cluster: RedisCluster | None = None
        self._lock = threading.Lock()

    def route(self, keys: list[str]) -> Routes:
        manager = self._connect().nodes_manager
        by_node: dict[str, dict[int, list[int]]] = {}
        for i, key in enumerate(keys):
            slot = key_slot(key.encode())
            node = manager.get_node_from_slot(slot).name
            by_node.setdefault(node, {}).setdefault(slot, []).append(i)
        return {node: list(slots.values()) for node, slots in by_node.items()}

    def client(self, node: str) -> redis.Redis:
        cluster = self._connect()
        found = cluster.get_node(node_name=node)
        if found is None:
            raise redis.ConnectionError(f"node {node} left the cluster")
        return cluster.get_redis_connection(found)

    def names(self) -> list[str]:
        if self._cluster is None:
            return []  # not connected yet (seeds may be replicas or other names for a master)
        return sorted(n.name for n in self._cluster.get_primaries())

    def refresh(self) -> None:
        """Reread the slot map (after a failover, a MOVED, a node back); failures are the
        caller's to count."""
        if self._cluster is None:
            self._connect()
        else:
            self._cluster.nodes_manager.initialize()

    def close(self) -> None:
        with self._lock:
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None

    def _connect(self) -> RedisCluster:
        with self._lock:
            if self._cluster is None:
                self._cluster = RedisCluster(
                    startup_nodes=[ClusterNode(h, p) for h, p in self.address.seeds],
                    require_full_coverage=False,  # a dead master costs its slots only
                    retry=Retry(NoBackoff(), 0),
                    **self._kwargs,
                )
            return self._cluster


def _read_reply(conn: Connection) -> Any:
    """One reply; an error reply (MOVED, CLUSTERDOWN, OOM ...) is returned, not raised."""
    try:
        return conn.read_response()
    except ResponseError as exc:
        return exc


def send_and_read(
    nodes: RedisNodes, routes: Routes, sent: list[str], command: Command
) -> dict[str, list[Any] | BaseException]:
    """A pipeline per node, all written before any is read: the nodes work concurrently
    while this thread reads their replies in turn (as redis-py's ClusterPipeline does), and
    a failing node costs only its own replies."""
    out: dict[str, list[Any] | BaseException] = {}
    written = {}
    for node, groups in routes.items():
        pool = conn = None
        try:
            pool = nodes.client(node).connection_pool
            conn = pool.get_connection()
            commands = [command([sent[i] for i in g], g) for g in groups]
            conn.send_packed_command(conn.pack_commands(commands))
            written[node] = (pool, conn)
        except FAILURES as exc:
            out[node] = exc
            if conn is not None:
                conn.disconnect()
                pool.release(conn)
    for node, (pool, conn) in written.items():
        try:
            out[node] = [_read_reply(conn) for _ in routes[node]]
        except FAILURES as exc:
            out[node] = exc
            conn.disconnect()  # replies may be left unread on it
        finally:
            pool.release(conn)
    return out
