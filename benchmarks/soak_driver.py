"""A soak load for a running server: many concurrent streaming clients, some of which hang up
mid-stream, with n>1, stop strings and long prompts. Used by bench_soak.py, bench_faults.py and
tests/api/test_soak.py, tests/api/test_faults.py.

Every request is greedy, so a completed one has exactly one right answer (the reference). A run
that tolerates a restart counts a request that fails with a connection error or a 503 as aborted
(its index in `aborted`, to be retried); without that, those are errors like any other."""

from __future__ import annotations

import asyncio
import json
import random
import string
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx


@dataclass(frozen=True)
class SoakRequest:
    prompt: str
    max_tokens: int
    n: int = 1
    stop: tuple[str, ...] = ()
    hang_up_after: int | None = None  # chunks read before the client disconnects


@dataclass
class SoakResult:
    texts: dict[int, list[str]] = field(default_factory=dict)  # completed: request -> choice texts
    hung_up: int = 0
    errors: list[str] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)  # HTTP status, or "connection"
    aborted: list[int] = field(default_factory=list)  # failed by a restart (tolerated runs only)
    cached_tokens: dict[int, int] = field(default_factory=dict)  # completed: usage's cached tokens

    @property
    def completed(self) -> int:
        return len(self.texts)


def make_requests(
    count: int,
    seed: int,
    prefixes: int = 4,
    prefix_len: int = 96,
    long_share: float = 0.1,
    head_seed: int | None = None,
) -> list[SoakRequest]:
    """Shared system-prompt-like prefixes (cache hits), random questions, a mix of features.
    `head_seed` draws the prefixes apart (the same ones for every `seed`); None: from `seed`."""
    rng = random.Random(seed)
    letters = string.ascii_letters + " "

    def text(n: int, source: random.Random = rng) -> str:
        return "".join(source.choice(letters) for _ in range(n))

    head_rng = rng if head_seed is None else random.Random(head_seed)
    heads = [text(prefix_len, head_rng) for _ in range(prefixes)]
    out = []
    for _ in range(count):
        body = text(rng.randrange(8, 40))
        if rng.random() < long_share:
            body += text(rng.randrange(200, 400))
        out.append(
            SoakRequest(
                prompt=rng.choice(heads) + body,
                max_tokens=rng.randrange(2, 12),
                n=2 if rng.random() < 0.2 else 1,
                stop=(rng.choice(letters[:26]),) if rng.random() < 0.3 else (),
                hang_up_after=rng.randrange(1, 4) if rng.random() < 0.25 else None,
            )
        )
    return out


async def _one(
    client: httpx.AsyncClient,
    model: str,
    index: int,
    req: SoakRequest,
    result: SoakResult,
    tolerate_restart: bool = False,
) -> None:
    try:
        await _stream(client, model, index, req, result, tolerate_restart)
    except httpx.TransportError as e:  # refused, reset mid-stream, timed out
        result.statuses["connection"] += 1
        if tolerate_restart:
            result.aborted.append(index)
        else:
            result.errors.append(f"connection: {e!r}")


async def _stream(
    client: httpx.AsyncClient,
    model: str,
    index: int,
    req: SoakRequest,
    result: SoakResult,
    tolerate_restart: bool,
) -> None:
    body = {
        "model": model,
        "prompt": req.prompt,
        "max_tokens": req.max_tokens,
        "n": req.n,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if req.stop:
        body["stop"] = list(req.stop)
    texts = [""] * req.n
    chunks = 0
    t0 = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as r:
        result.statuses[str(r.status_code)] += 1
        if r.status_code == 503 and tolerate_restart:
            result.aborted.append(index)
            return
        if r.status_code != 200:
            result.errors.append(f"{r.status_code}: {(await r.aread())[:200]!r}")
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                result.texts[index] = texts
                return
            event = json.loads(line[6:])
            if "error" in event:
                result.errors.append(str(event["error"]))
                return
            if event.get("usage"):
                details = event["usage"].get("prompt_tokens_details") or {}
                result.cached_tokens[index] = details.get("cached_tokens", 0)
            if not event["choices"]:
                continue  # the usage chunk
            if chunks == 0:
                result.ttft_s.append(time.perf_counter() - t0)
            chunks += 1
            for choice in event["choices"]:
                texts[choice["index"]] += choice["text"]
            if req.hang_up_after is not None and chunks >= req.hang_up_after:
                result.hung_up += 1
                return  # leaving the block closes the connection mid-stream
    result.errors.append("stream ended without [DONE]")


async def run_soak(
    url: str,
    model: str,
    requests: list[SoakRequest],
    concurrency: int,
    timeout_s: float = 300,
    *,
    result: SoakResult | None = None,
    indices: list[int] | None = None,
    tolerate_restart: bool = False,
) -> SoakResult:
    """Runs `requests` (those at `indices`, default all) through `concurrency` clients at once;
    bounded by `timeout_s`. Pass `result` to watch progress from another thread."""
    result = SoakResult() if result is None else result
    order = range(len(requests)) if indices is None else indices
    queue = [(i, requests[i]) for i in order][::-1]

    async def client_loop(client: httpx.AsyncClient) -> None:
        while queue:
            index, req = queue.pop()
            await _one(client, model, index, req, result, tolerate_restart)

    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        tasks = [client_loop(client) for _ in range(concurrency)]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout_s)
    result.elapsed_s = time.perf_counter() - t0
    return result


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def is_idle(report: dict) -> bool:
    """An integrity report of a server with nothing running, waiting or holding a block."""
    quiet = report["requests"] == {"running": 0, "waiting": 0} and report["in_flight"] == 0
    return quiet and report["blocks"]["referenced"] == 0


def wait_idle(url: str, timeout_s: float = 60) -> dict:
    """Polls the admin integrity report until the server is idle (or the deadline); the last one."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, timeout=30) as client:
        while True:
            report = client.get("/v1/cache/integrity").json()
            if is_idle(report) or time.monotonic() > deadline:
                return report
            time.sleep(0.02)  # polling interval


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")
