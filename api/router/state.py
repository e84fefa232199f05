"""RouterState: the router's parts and counters, and the health checks that take replicas out
of rotation and put them back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from statistics import mean, quantiles
from typing import Any

import httpx
from fastapi import Request

from api.auth import Caller
from api.errors import ApiError
from api.router.affinity import AffinityKey, KeyAffinity, key_affinity
from api.router.config import RouterConfig
from api.router.conversations import ResponseHomes, response_homes
from api.router.discovery import Discovery
from api.router.policy import Router
from api.router.replicas import Replica, ReplicaSpec, build_replica
from api.router.tokenize import PromptTokenizer

log = logging.getLogger("radixcache.router")


@dataclass
class Overhead:
    """Router time per request, in µs: tokenizing the prompt, then matching, choosing and noting
    what was sent (wall time, which includes waiting for a busy CPU, and the CPU time those steps
    used); and, apart, the tails tokenized after a request was routed (off its path)."""

    samples: deque[tuple[float, float, float]] = field(
        default_factory=lambda: deque(maxlen=100_000)
    )
    deferred: deque[float] = field(default_factory=lambda: deque(maxlen=100_000))

    def add(self, tokenize_us: float, route_us: float, cpu_us: float) -> None:
        self.samples.append((tokenize_us, route_us, cpu_us))

    def add_deferred(self, tokenize_us: float) -> None:
        self.deferred.append(tokenize_us)

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {"count": 0}
        total = [a + b for a, b, _ in self.samples]
        cuts = quantiles(total, n=100) if len(total) > 1 else [total[0]] * 99
        return {
            "count": len(total),
            "mean_us": mean(total),
            "p50_us": cuts[49],
            "p99_us": cuts[98],
            "tokenize_mean_us": mean(a for a, _, _ in self.samples),
            "route_mean_us": mean(b for _, b, _ in self.samples),
            "cpu_mean_us": mean(c for _, _, c in self.samples),
            "deferred_count": len(self.deferred),
            "deferred_tokenize_mean_us": mean(self.deferred) if self.deferred else 0.0,
        }


@dataclass
class RouterState:
    config: RouterConfig
    replicas: list[Replica]
    router: Router
    tokenizer: PromptTokenizer
    client: httpx.AsyncClient
    affinity: KeyAffinity = field(default_factory=key_affinity)
    conversations: ResponseHomes = field(default_factory=response_homes)
    overhead: Overhead = field(default_factory=Overhead)
    decisions: Counter[str] = field(default_factory=Counter)
    unrouted: int = 0  # requests no replica could take (503)
    background: set[asyncio.Task] = field(default_factory=set)
    discovery: Discovery | None = None  # --replicas-dns

    def add_replica(self, name: str, spec: ReplicaSpec, discovered: bool = False) -> Replica:
        """A replica joins: its subscriber starts (replaying its events from the first), and it
        is in rotation once a health check sees it ready."""
        r = build_replica(name, spec, self.config.index_blocks, self.config.block_size)
        r.discovered = discovered
        r.healthy = False
        if r.subscriber is not None:
            r.subscriber.start()
        self.replicas = [*self.replicas, r]  # a new list: a request iterating the old one is safe
        return r

    async def drop_replica(self, r: Replica) -> None:
        """A replica leaves: out of rotation, its keys and ids forgotten, its index with it.
        Requests already sent to it finish there."""
        self.take_out(r)
        self.replicas = [x for x in self.replicas if x is not r]
        if r.subscriber is not None:
            await asyncio.to_thread(r.subscriber.close)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Runs work beside the requests (held here until done; a failure is logged)."""
        task = asyncio.get_running_loop().create_task(work)
        self.background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:
        self.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("router background work failed", exc_info=task.exception())

    def candidates(self, tried: set[str]) -> list[Replica]:
        return [r for r in self.replicas if r.healthy and r.name not in tried]

    def take_out(self, r: Replica) -> None:
        """Out of rotation until a health check sees it answer; its prompt_cache_keys move on, and
        so do its conversations (another replica answers what it knows of them)."""
        r.healthy = False
        self.affinity.forget_replica(r.name)
        self.conversations.forget_replica(r.name)

    def stats(self) -> dict:
        return {
            "policy": self.router.policy,
            "decisions": dict(self.decisions),
            "key_affinity": self.affinity.stats(),
            "response_ids": {
                **self.conversations.stats(),
                "shared_store": self.config.shared_response_store,
            },
            "unrouted": self.unrouted,
            "overhead": self.overhead.summary(),
            "tokenizer": self.tokenizer.segments.stats(),
            "replicas": {r.name: r.stats() for r in self.replicas},
            "discovery": None if self.discovery is None else self.discovery.stats(),
        }


def router_state(request: Request) -> RouterState:
    state = getattr(request.app.state, "router", None)
    if state is None:
        raise ApiError(503, "The router is not ready yet", code="not_ready")
    return state


def affinity_key(caller: Caller, key: object) -> AffinityKey | None:
    """A request's prompt_cache_key within its caller's tenant (None: it has none, or not a
    string: the replica refuses it)."""
    return (caller.tenant or "", key) if isinstance(key, str) else None


async def check_health(state: RouterState) -> None:
    """One round: every replica's /ready; a 200 puts it (back) in rotation, anything else takes it
    out: a replica that is starting, draining (SIGTERM, POST /admin/drain) or gone gets no new
    request."""

    async def probe(r: Replica) -> None:
        try:
            resp = await state.client.get(
                f"{r.spec.url}/ready", timeout=state.config.connect_timeout_s
            )
            ready = resp.status_code == 200
        except httpx.HTTPError:
            ready = False
        if ready:
            r.healthy = True
        elif r.healthy:
            state.take_out(r)

    await asyncio.gather(*(probe(r) for r in state.replicas))


async def health_forever(state: RouterState) -> None:
    while True:
        await asyncio.sleep(state.config.health_interval_s)
        with contextlib.suppress(Exception):
            await check_health(state)
