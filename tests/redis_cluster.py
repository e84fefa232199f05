"""A real 3-master Redis Cluster on free loopback ports, for tests (import the `redis_cluster` fixture).

from tests.redis_cluster import redis_cluster  # noqa: F401  (in a conftest.py)

def test_x(redis_cluster):          # or: with running_cluster(folder) as redis_cluster: ...
    url = redis_cluster.url         # redis+cluster://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>
    node = redis_cluster.owner(key) # the master serving a key's slot
    node.kill()                     # SIGKILL, as a crash would; the others keep serving its peers' slots
    redis_cluster.restart(node)     # same port and cluster identity (nodes.conf), empty data

Each node runs with `cluster-require-full-coverage no` (the live masters keep serving while one is
down: the setting docs/redis-cluster.md recommends) and a short node timeout so a crash is noticed
within a second. Cluster bus ports are chosen free as well (`--cluster-port`).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from tests.ports import free_port
from tests.redis_server import STARTUP_TIMEOUT_S, RedisServer, TlsFiles

NODE_TIMEOUT_MS = 500
POLL_S = 0.02  # poll interval while waiting for the cluster to reach a state


class ClusterNode(RedisServer):
    """One cluster-enabled redis-server; its folder keeps nodes.conf across restarts."""

    def __init__(self, workdir: Path, tls: TlsFiles | None = None) -> None:
        super().__init__(workdir, tls=tls)
        self.bus_port = free_port()

    def extra_args(self) -> list[str]:
        return [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-port", str(self.bus_port),
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--cluster-require-full-coverage", "no",
            *(["--tls-cluster", "yes"] if self.tls else []),  # the bus and redirects speak TLS
        ]  # fmt: skip

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def node_id(self) -> str:
        return self.client().execute_command("CLUSTER MYID").decode()


class RedisClusterServers:
    def __init__(self, workdir: Path, masters: int = 3, tls: TlsFiles | None = None) -> None:
        self.cli = shutil.which("redis-cli")
        if self.cli is None:
            raise RuntimeError(
                "redis-cli not found: run `make install-dev` (scripts/ensure_redis.sh)"
            )
        self.tls = tls
        self.nodes = [ClusterNode(_mkdir(workdir / f"node{i}"), tls) for i in range(masters)]

    @property
    def url(self) -> str:
        seeds = ",".join(n.address for n in self.nodes)
        if self.tls is None:
            return f"redis+cluster://{seeds}"
        return f"rediss+cluster://{seeds}?ssl_ca_certs={self.tls.ca_cert}"

    def cli_args(self) -> list[str]:
        tls = ["--tls", "--cacert", str(self.tls.ca_cert)] if self.tls else []
        return [self.cli, *tls]

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [*self.cli_args(), "--cluster", "create", *[n.address for n in self.nodes],
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=STARTUP_TIMEOUT_S * 3,
        )  # fmt: skip
        self.wait_healthy()

    def wait_healthy(self) -> None:
        """Until every running node reports cluster_state ok and sees every other node connected."""
        running = [n for n in self.nodes if n.running]
        end = time.monotonic() + STARTUP_TIMEOUT_S * 3
        while not all(self._healthy(n, len(running)) for n in running):
            if time.monotonic() > end:
                raise RuntimeError("redis cluster did not become healthy")
            time.sleep(POLL_S)

    def wait_noticed_down(self, dead: ClusterNode) -> None:
        """Until every running node has marked `dead` as failed (its crash is known cluster-wide)."""
        end = time.monotonic() + STARTUP_TIMEOUT_S * 3
        live = [n for n in self.nodes if n.running]
        while not all(self._sees_failed(n, dead) for n in live):
            if time.monotonic() > end:
                raise RuntimeError(f"node {dead.address} not marked failed")
            time.sleep(POLL_S)

    def owner(self, key: str | bytes) -> ClusterNode:
        """The master whose slot range holds `key` (from CLUSTER SLOTS of a running node)."""
        slot = key_slot(key.encode() if isinstance(key, str) else key)
        ask = next(n for n in self.nodes if n.running)
        for start, end, master, *_ in ask.client().execute_command("CLUSTER SLOTS"):
            if start <= slot <= end:
                port = int(master[1])
                return next(n for n in self.nodes if n.port == port)
        raise LookupError(f"slot {slot} not covered")

    def add_replica(self, master: ClusterNode) -> ClusterNode:
        """A new node replicating `master`, in sync when this returns."""
        folder = _mkdir(self.nodes[0].workdir.parent / f"node{len(self.nodes)}")
        replica = ClusterNode(folder, self.tls)
        replica.start()
        self.nodes.append(replica)
        subprocess.run(
            [*self.cli_args(), "--cluster", "add-node", replica.address, master.address,
             "--cluster-slave", "--cluster-master-id", master.node_id()],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=STARTUP_TIMEOUT_S * 3,
        )  # fmt: skip
        end = time.monotonic() + STARTUP_TIMEOUT_S * 3
        while replica.client().info("replication").get("master_link_status") != "up":
            if time.monotonic() > end:
                raise RuntimeError("replica did not sync")
            time.sleep(POLL_S)
        self.wait_healthy()
        return replica

    def wait_promoted(self, replica: ClusterNode) -> None:
        """Until `replica` has taken over its dead master's slots (automatic failover) and every
        running node's slot map says so."""
        end = time.monotonic() + STARTUP_TIMEOUT_S * 3
        while not all(self._serves_slots(n, replica) for n in self.nodes if n.running):
            if time.monotonic() > end:
                raise RuntimeError("replica was not promoted")
            time.sleep(POLL_S)
        self.wait_healthy()

    def restart(self, node: ClusterNode) -> None:
        """Starts a killed node again: same port and nodes.conf (it rejoins with its slots), no data."""
        node.start()
        self.wait_healthy()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def client(self) -> redis.RedisCluster:
        running = [n for n in self.nodes if n.running]
        startup = [redis.cluster.ClusterNode("127.0.0.1", n.port) for n in running]
        tls = {"ssl": True, "ssl_ca_certs": str(self.tls.ca_cert)} if self.tls else {}
        return redis.RedisCluster(startup_nodes=startup, socket_timeout=2, **tls)

    @staticmethod
    def _healthy(node: ClusterNode, expected: int) -> bool:
        try:
            client = node.client()
            ok = client.execute_command("CLUSTER INFO")["cluster_state"] == "ok"
            peers = client.execute_command("CLUSTER NODES").values()
        except redis.RedisError:
            return False
        live = [p for p in peers if p["connected"] and "fail" not in p["flags"]]  # fail, fail?
        return ok and len(live) >= expected

    @staticmethod
    def _serves_slots(node: ClusterNode, master: ClusterNode) -> bool:
        slots = node.client().execute_command("CLUSTER SLOTS")
        return any(int(owner[1]) == master.port for _, _, owner, *_ in slots)

    @staticmethod
    def _sees_failed(node: ClusterNode, dead: ClusterNode) -> bool:
        peers = node.client().execute_command("CLUSTER NODES")
        flags = [
            p["flags"].split(",") for addr, p in peers.items() if addr.endswith(f":{dead.port}")
        ]
        return any("fail" in f for f in flags)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def running_cluster(workdir: Path, tls: TlsFiles | None = None) -> Iterator[RedisClusterServers]:
    cluster = RedisClusterServers(workdir, tls=tls)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with running_cluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster
