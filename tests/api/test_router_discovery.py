"""`radixcache route --replicas-dns NAME:PORT`: the router resolves the name again and again and
keeps one replica per address, as a Kubernetes headless Service's records come and go. The name
is real (a line of /etc/hosts, read by the same resolver as DNS answers), its addresses are two
loopback addresses whose replicas listen on the same ports, as a Service's pods do."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.config import ApiConfig
from api.router.config import RouterConfig
from api.router.discovery import DnsReplicas
from engine.kv.events import KVEventsConfig
from tests.api.router_peers import RouterHandle, start_router, wait_until
from tests.api.servers import Server, engine_config, start_server

HOSTS = Path("/etc/hosts")
ADDRESSES = ("127.0.0.2", "127.0.0.3")
HEADER = "x-radixcache-replica"


class HostsName:
    """A name of our own in /etc/hosts, pointing at the addresses we set; removed at the end."""

    def __init__(self) -> None:
        self.name = f"rc-replicas-{uuid.uuid4().hex[:8]}.test"
        self.original = HOSTS.read_text()

    def point_at(self, *addresses: str) -> None:
        lines = "".join(f"{a} {self.name}\n" for a in addresses)
        _rewrite(self.original + lines)

    def remove(self) -> None:
        _rewrite(self.original)


def _rewrite(text: str) -> None:
    """/etc/hosts rewritten in place, then cut to length: truncating first (write_text) left a
    moment with no record at all, and a lookup of the router's landing there counted a failure.
    The tests only add or drop lines after the first, so every moment holds the first address."""
    data = text.encode()
    fd = os.open(HOSTS, os.O_WRONLY)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def ports_free_on_every_address() -> tuple[int, int, int]:
    """Three ports free on both addresses (HTTP, KV events, replay), as a Service's pods share."""
    found: list[int] = []
    while len(found) < 3:
        with socket.socket() as probe:
            probe.bind((ADDRESSES[0], 0))
            port = probe.getsockname()[1]
        try:
            with socket.socket() as other:
                other.bind((ADDRESSES[1], port))
        except OSError:
            continue
        if port not in found:
            found.append(port)
    return found[0], found[1], found[2]


@pytest.fixture(scope="module")
def hosts() -> Iterator[HostsName]:
    name = HostsName()  # the test runs as root, as the namespace tests do
    yield name
    name.remove()


@pytest.fixture(scope="module")
def pods(tiny_llama: Path) -> Iterator[tuple[list[Server], tuple[int, int, int]]]:
    http, events, replay = ports = ports_free_on_every_address()
    servers = []
    try:
        for address in ADDRESSES:
            kv = KVEventsConfig(f"tcp://{address}:{events}", f"tcp://{address}:{replay}")
            cfg = engine_config(tiny_llama, kv_events=kv)
            servers.append(start_server(cfg, ApiConfig(), host=address, port=http))
        yield servers, ports
    finally:
        for s in servers:
            s.stop()


def _router(hosts: HostsName, ports: tuple[int, int, int], tiny_llama: Path) -> RouterHandle:
    http, events, replay = ports
    dns = DnsReplicas(hosts.name, http, events, replay, interval_s=0.05)
    config = RouterConfig(
        (), tiny_llama, policy="round-robin", replicas_dns=dns, health_interval_s=0.05
    )
    return start_router(config)


def _names(router: RouterHandle, healthy: bool = True) -> set[str]:
    replicas = router.stats()["replicas"]
    return {n for n, r in replicas.items() if r["healthy"] or not healthy}


def _chat(router: RouterHandle, model: str, text: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 2}
    r = httpx.post(f"{router.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_replicas_follow_the_names_records(
    hosts: HostsName, pods: tuple[list[Server], tuple[int, int, int]], tiny_llama: Path
) -> None:
    servers, ports = pods
    model = servers[0].model
    both = {f"{a}:{ports[0]}" for a in ADDRESSES}
    hosts.point_at(*ADDRESSES)
    router = _router(hosts, ports, tiny_llama)
    try:
        wait_until(lambda: _names(router) == both, 30, "both replicas in rotation")
        homes = {_chat(router, model, f"hello {i}").headers[HEADER] for i in range(4)}
        assert homes == both  # round-robin over what DNS gave
        # a record goes (a pod scaled away): its replica is dropped, its index with it
        hosts.point_at(ADDRESSES[0])
        first = f"{ADDRESSES[0]}:{ports[0]}"
        wait_until(lambda: _names(router, healthy=False) == {first}, 30, "the drop")
        homes = {_chat(router, model, f"again {i}").headers[HEADER] for i in range(3)}
        assert homes == {first}
        # it comes back (a new pod on the address): a fresh index, rebuilt from its events
        hosts.point_at(*ADDRESSES)
        wait_until(lambda: _names(router) == both, 30, "the return")
        back = f"{ADDRESSES[1]}:{ports[0]}"
        subscriber = lambda: router.stats()["replicas"][back]["subscriber"]  # noqa: E731
        wait_until(lambda: subscriber()["batches"] > 0, 30, "its events replayed")
        stats = router.stats()["discovery"]
        assert stats["added"] == 3 and stats["dropped"] == 1 and stats["failures"] == 0
    finally:
        router.stop()


def test_a_name_that_stops_resolving_keeps_the_replicas(
    hosts: HostsName, pods: tuple[list[Server], tuple[int, int, int]], tiny_llama: Path
) -> None:
    servers, ports = pods
    hosts.point_at(*ADDRESSES)
    router = _router(hosts, ports, tiny_llama)
    try:
        wait_until(lambda: len(_names(router)) == 2, 30, "both replicas")
        hosts.remove()  # NXDOMAIN: a DNS outage must not empty the router
        wait_until(lambda: router.stats()["discovery"]["failures"] >= 2, 30, "failed lookups")
        assert len(_names(router)) == 2
        _chat(router, servers[0].model, "still served")
    finally:
        router.stop()
