"""Replicas found by DNS: `--replicas-dns NAME:PORT` names a headless Service, whose records are
one address per ready pod. The name is resolved again every `interval_s`: an address that appears
is a replica added (its index rebuilt from its KV-events replay, in rotation once its /ready
answers), an address that goes is a replica dropped (out of rotation, its index, prompt_cache_keys
and response ids forgotten, its subscriber closed; requests already on it finish). A resolution
that fails changes nothing. A fixed --replica list stays as it is beside it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from api.router.replicas import ReplicaSpec

if TYPE_CHECKING:
    from api.router.state import RouterState

log = logging.getLogger("radixcache.router")


@dataclass(frozen=True)
class DnsReplicas:
    host: str
    port: int
    events_port: int | None = None  # each replica's KV-events PUB port
    replay_port: int | None = None  # and its replay port (with events only)
    interval_s: float = 5.0

    @classmethod
    def parse(cls, text: str, **settings: object) -> DnsReplicas:
        """'NAME:PORT' (e.g. a headless Service: radixcache-replicas:8000)."""
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"--replicas-dns wants NAME:PORT, got {text!r}")
        return cls(host, int(port), **settings)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        if self.replay_port is not None and self.events_port is None:
            raise ValueError("--replica-replay-port needs --replica-events-port")

    def spec(self, address: str) -> ReplicaSpec:
        host = f"[{address}]" if ":" in address else address  # an IPv6 address in a URL
        events = None if self.events_port is None else f"tcp://{host}:{self.events_port}"
        replay = None if self.replay_port is None else f"tcp://{host}:{self.replay_port}"
        return ReplicaSpec(f"http://{host}:{self.port}", events, replay)

    def name(self, address: str) -> str:
        return f"{address}:{self.port}"


async def resolve(host: str, port: int) -> list[str]:
    """Every address the name has now (the resolver's view: /etc/hosts, then DNS)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


@dataclass
class Discovery:
    dns: DnsReplicas
    resolutions: int = 0
    failures: int = 0
    added: int = 0
    dropped: int = 0

    async def sync(self, state: RouterState) -> None:
        """Resolves once; adds the replicas of new addresses, drops those of addresses gone."""
        try:
            addresses = await resolve(self.dns.host, self.dns.port)
        except OSError as exc:
            self.failures += 1
            log.warning("resolving %s failed (%s): keeping the replicas", self.dns.host, exc)
            return
        self.resolutions += 1
        wanted = {self.dns.name(a): a for a in addresses}
        found = {r.name for r in state.replicas if r.discovered}
        for name in sorted(wanted.keys() - found):
            state.add_replica(name, self.dns.spec(wanted[name]), discovered=True)
            self.added += 1
            log.info("replica %s joined", name)
        for r in [r for r in state.replicas if r.discovered and r.name not in wanted]:
            await state.drop_replica(r)
            self.dropped += 1
            log.info("replica %s left", r.name)

    async def forever(self, state: RouterState) -> None:
        while True:
            await asyncio.sleep(self.dns.interval_s)
            with contextlib.suppress(Exception):
                await self.sync(state)

    def stats(self) -> dict:
        return {
            "dns": f"{self.dns.host}:{self.dns.port}",
            "interval_s": self.dns.interval_s,
            "resolutions": self.resolutions,
            "failures": self.failures,
            "added": self.added,
            "dropped": self.dropped,
        }
