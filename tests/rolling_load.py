"""A rolling restart under load, for tests/api/test_rolling_restart.py and
benchmarks/bench_rolling.py: streaming chat clients that share system prompts run against a router
(in a thread of their own, each client one request after another) while the replicas behind it are
SIGTERMed and started again one at a time. Every request is recorded with the phase it started in;
`summarise` gives per phase the requests, failures, truncated streams, TTFT and hit rate."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import numpy as np

from tests.restartable_serve import RestartableServe

VOCABULARY = (
    "cache block prefix replica router drain token stream answer model tier redis shared "
    "restart signal request client engine layer batch query value key system prompt user"
)
WORDS = VOCABULARY.split()


@dataclass(frozen=True)
class ChatWorkload:
    """Chats of one of `systems` system prompts (`system_words` words each) and a message of its
    own (`user_words` words), answered with `max_tokens` tokens (greedy, EOS ignored)."""

    model: str
    systems: int = 4
    system_words: int = 40
    user_words: int = 8
    max_tokens: int = 16
    seed: int = 0

    def system_prompts(self) -> list[str]:
        rng = random.Random(self.seed)
        return [
            f"You are agent {i}. " + " ".join(rng.choices(WORDS, k=self.system_words))
            for i in range(self.systems)
        ]

    def body(self, system: str, rng: random.Random) -> dict:
        return {
            "model": self.model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": " ".join(rng.choices(WORDS, k=self.user_words))},
            ],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }


@dataclass
class Outcome:
    phase: str  # the phase the request started in
    started: float  # time.monotonic()
    ended: float = 0.0
    status: int | None = None  # None: no answer at all (the connection failed)
    replica: str | None = None  # the router's x-radixcache-replica header
    ttft_s: float | None = None  # until the first chunk with content
    prompt_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    done: bool = False  # [DONE] came
    error: str | None = None  # an exception, or an error event in the stream

    @property
    def failed(self) -> bool:
        """Refused or never answered (a stream that began and broke off is `truncated`)."""
        return self.status != 200

    @property
    def truncated(self) -> bool:
        return self.status == 200 and (
            not self.done or self.finish_reason is None or self.error is not None
        )


async def stream_chat(client: httpx.AsyncClient, url: str, body: dict, out: Outcome) -> None:
    """One streamed chat through the router, its outcome filled in as it goes."""
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
            out.status = resp.status_code
            out.replica = resp.headers.get("x-radixcache-replica")
            if resp.status_code != 200:
                out.error = (await resp.aread()).decode(errors="replace")[:500]
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    out.done = True
                    continue
                _read_chunk(json.loads(line[6:]), out)
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        out.ended = time.monotonic()


def _read_chunk(chunk: dict, out: Outcome) -> None:
    if "error" in chunk:
        out.error = json.dumps(chunk["error"])
        return
    for choice in chunk.get("choices", []):
        if out.ttft_s is None and choice.get("delta", {}).get("content"):
            out.ttft_s = time.monotonic() - out.started
        if choice.get("finish_reason"):
            out.finish_reason = choice["finish_reason"]
    usage = chunk.get("usage")
    if usage:
        out.prompt_tokens = usage["prompt_tokens"]
        details = usage.get("prompt_tokens_details") or {}
        out.cached_tokens = details.get("cached_tokens") or 0


@dataclass
class Load:
    """`clients` streaming clients against `url`, in a thread with its own event loop, until
    `stop()`. `phase` names the phase new requests start in (set by the caller as it goes)."""

    url: str
    workload: ChatWorkload
    clients: int
    timeout_s: float = 120.0
    phase: str = "before"
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Lets every client finish the request it is on, then returns."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 30)
            assert not self._thread.is_alive(), "the clients did not stop"

    async def _run(self) -> None:
        systems = self.workload.system_prompts()
        limits = httpx.Limits(max_connections=self.clients, max_keepalive_connections=self.clients)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as client:
            await asyncio.gather(*(self._client(client, i, systems) for i in range(self.clients)))

    async def _client(self, client: httpx.AsyncClient, i: int, systems: list[str]) -> None:
        rng = random.Random(self.workload.seed * 1000 + i)
        n = i  # client i starts on system prompt i: every system prompt is asked for at once
        while not self._stop.is_set():
            out = Outcome(self.phase, time.monotonic())
            body = self.workload.body(systems[n % len(systems)], rng)
            await stream_chat(client, self.url, body, out)
            self.outcomes.append(out)
            n = rng.randrange(len(systems))

    def finished(self, since: float = 0.0, replica: str | None = None) -> list[Outcome]:
        """Requests started at or after `since` that have ended (served by `replica`, if given)."""
        return [
            o
            for o in list(self.outcomes)
            if o.started >= since and (replica is None or o.replica == replica)
        ]


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling interval


@dataclass
class Restart:
    replica: str  # the router's name for it (r0, r1, ...)
    exit_code: int | None
    sigterm_at: float
    exited_at: float
    back_at: float  # the router saw the new process ready

    def as_dict(self) -> dict:
        return {
            "replica": self.replica,
            "exit_code": self.exit_code,
            "drain_s": round(self.exited_at - self.sigterm_at, 3),
            "down_s": round(self.back_at - self.sigterm_at, 3),
        }


def restart_in_turn(
    server: RestartableServe,
    name: str,
    router_stats: Callable[[], dict],
    exit_timeout_s: float = 120.0,
    start_timeout_s: float = 600.0,
) -> Restart:
    """SIGTERM the replica, wait for its exit (the drain over), see the router take it out, start
    it again on the same port and folders, and wait until the router sees it ready."""
    assert server.proc is not None
    sigterm_at = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code = server.proc.wait(timeout=exit_timeout_s)
    exited_at = time.monotonic()
    server.proc = None

    def healthy() -> bool:
        return router_stats()["replicas"][name]["healthy"]

    wait_for(lambda: not healthy(), 30, f"the router to take {name} out")
    server.start()
    server.wait_healthy(start_timeout_s)
    wait_for(healthy, 30, f"the router to put {name} back")
    return Restart(name, code, sigterm_at, exited_at, time.monotonic())


def roll(
    load: Load,
    servers: list[RestartableServe],
    router_stats: Callable[[], dict],
    settle_requests: int,
    start_timeout_s: float = 600.0,
) -> tuple[list[str], list[Restart]]:
    """The whole rolling restart under `load`: `settle_requests` requests before, then for each
    replica in turn (r0, r1, ...) its restart (phase "rN restarting": SIGTERM until the router
    has it back) and `settle_requests` requests after (phase "rN back", the last one "after").
    Returns the phases in order and the restarts."""

    def settle(since: float) -> None:
        wait_for(lambda: len(load.finished(since)) >= settle_requests, 300, "requests to finish")

    phases = ["before"]
    settle(0.0)
    restarts = []
    for i, server in enumerate(servers):
        name = f"r{i}"
        load.phase = f"{name} restarting"
        phases.append(load.phase)
        restarts.append(
            restart_in_turn(server, name, router_stats, start_timeout_s=start_timeout_s)
        )
        load.phase = "after" if i == len(servers) - 1 else f"{name} back"
        phases.append(load.phase)
        settle(restarts[-1].back_at)
    return phases, restarts


def first_served(load: Load, restart: Restart) -> Outcome | None:
    """The first request the restarted process answered (after the SIGTERM, the old process
    refused every new request: whatever that replica answered since, the new one did)."""
    served = load.finished(restart.sigterm_at, restart.replica)
    return min(served, key=lambda o: o.started) if served else None


def summarise(outcomes: list[Outcome], phases: list[str]) -> list[dict]:
    """Per phase: requests, failed, truncated, TTFT p50/p99 (ms) and hit rate (cached / prompt
    tokens), and how many requests each replica answered."""
    rows = []
    for phase in phases:
        mine = [o for o in outcomes if o.phase == phase]
        ttft = np.array([o.ttft_s for o in mine if o.ttft_s is not None]) * 1000
        prompt = sum(o.prompt_tokens for o in mine)
        replicas: dict[str, int] = {}
        for o in mine:
            if o.replica is not None:
                replicas[o.replica] = replicas.get(o.replica, 0) + 1
        rows.append(
            {
                "phase": phase,
                "requests": len(mine),
                "failed": sum(o.failed for o in mine),
                "truncated": sum(o.truncated for o in mine),
                "ttft_p50_ms": round(float(np.percentile(ttft, 50)), 1) if ttft.size else None,
                "ttft_p99_ms": round(float(np.percentile(ttft, 99)), 1) if ttft.size else None,
                "hit_rate": round(sum(o.cached_tokens for o in mine) / prompt, 4) if prompt else 0,
                "by_replica": dict(sorted(replicas.items())),
            }
        )
    return rows
