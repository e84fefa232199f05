"""Faults under a streaming soak (bench_faults.py, tests/api/test_faults.py): a phase runs the soak
load (benchmarks.soak_driver) against a server while, in a "during" phase, a fault is injected from
this process once a share of the requests is done and recovered when the load ends. Meanwhile the
device cache is flushed every few requests, so shared prefixes keep coming back from the tiers.

A request that a restart aborts (connection error or 503, in phases that tolerate it) is retried
once the load ends; its retry must be 200 and right like every other request."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

from benchmarks.soak_driver import SoakRequest, SoakResult, percentile, run_soak


class Fault(Protocol):
    name: str

    def inject(self) -> None: ...

    def recover(self) -> None: ...


@dataclass(frozen=True)
class PhaseReport:
    fault: str
    phase: str  # before / during / after
    requests: int
    completed: int
    hung_up: int
    aborted: int  # failed by a restart; retried after the load (retries are in `completed`)
    errors: tuple[str, ...]
    statuses: dict[str, int]  # first tries and retries: HTTP status, or "connection"
    wrong: int  # completed answers that differ from the cache-off reference
    requests_per_s: float  # requests served (completed or hung up) per second of the load
    ttft_p50_s: float
    ttft_p99_s: float
    hit_tokens: int  # the server's hit tokens over the phase (device and tiers)
    hit_tokens_by_tier: dict[str, int]
    cached_tokens: int  # summed usage.prompt_tokens_details.cached_tokens of completed requests
    later_cached: int  # of those, in requests not yet finished when the fault was injected


@dataclass
class _Progress:
    result: SoakResult = field(default_factory=SoakResult)

    def done(self) -> int:
        return self.result.completed + self.result.hung_up + len(self.result.aborted)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)  # polling interval


def cache_stats(url: str) -> dict | None:
    """/v1/cache/stats, or None while the server is down."""
    try:
        return httpx.get(url + "/v1/cache/stats", timeout=30).json()
    except httpx.TransportError:
        return None


def _hits(stats: dict | None) -> dict[str, int]:
    return {} if stats is None else dict(stats["since_start"]["hit_tokens_by_tier"])


def _flusher(url: str, progress: _Progress, every: int, stop: threading.Event) -> None:
    """Flushes the device cache after every `every` requests served (tier traffic)."""
    mark = 0
    while not stop.is_set():
        if every and progress.done() >= mark + every:
            mark = progress.done()
            with contextlib.suppress(httpx.TransportError):  # down for a restart
                httpx.post(url + "/v1/cache/flush", timeout=30)
        stop.wait(0.02)  # polling interval


def run_phase(
    url: str,
    model: str,
    requests: list[SoakRequest],
    want: list[str],
    clients: int,
    *,
    fault: str,
    phase: str,
    inject: Fault | None = None,
    trigger_share: float = 0.25,
    flush_every: int = 8,
    tolerate_restart: bool = False,
    timeout_s: float = 600,
) -> PhaseReport:
    """One phase of the soak; with `inject`, the fault starts once `trigger_share` of the requests
    are done and is recovered when the load ends."""
    before = _hits(cache_stats(url))
    progress, stop = _Progress(), threading.Event()
    flusher = threading.Thread(target=_flusher, args=(url, progress, flush_every, stop))

    def load() -> None:
        try:
            asyncio.run(
                run_soak(
                    url, model, requests, clients, timeout_s,
                    result=progress.result, tolerate_restart=tolerate_restart,
                )
            )  # fmt: skip
        except Exception as e:  # (a timeout): reported with the phase, not lost in the thread
            progress.result.errors.append(f"load: {e!r}")

    soak = threading.Thread(target=load)
    flusher.start()
    soak.start()
    started_after: set[int] = set()
    try:
        if inject is not None:
            trigger = int(trigger_share * len(requests))
            wait_for(lambda: progress.done() >= trigger or not soak.is_alive(), timeout_s, "load")
            started_after = set(range(len(requests))) - _touched(progress.result)
            inject.inject()
        soak.join(timeout_s)
    finally:
        stop.set()
        flusher.join()
        if inject is not None:
            inject.recover()
    result = progress.result
    retried = _retry(url, model, requests, clients, result, timeout_s) if result.aborted else None
    after = _hits(cache_stats(url))
    return _report(fault, phase, requests, want, result, retried, before, after, started_after)


def _touched(result: SoakResult) -> set[int]:
    """Requests finished (or aborted) so far."""
    return set(result.texts) | set(result.aborted)


def _retry(
    url: str,
    model: str,
    requests: list[SoakRequest],
    clients: int,
    first: SoakResult,
    timeout_s: float,
) -> SoakResult:
    return asyncio.run(run_soak(url, model, requests, clients, timeout_s, indices=first.aborted))


def _report(
    fault: str,
    phase: str,
    requests: list[SoakRequest],
    want: list[str],
    result: SoakResult,
    retried: SoakResult | None,
    before: dict[str, int],
    after: dict[str, int],
    started_after: set[int],
) -> PhaseReport:
    texts = dict(result.texts)
    cached = dict(result.cached_tokens)
    errors, statuses = list(result.errors), Counter(result.statuses)
    if retried is not None:
        texts |= retried.texts
        cached |= retried.cached_tokens
        errors += retried.errors
        statuses += retried.statuses
    restarted = sum(after.values()) < sum(before.values())  # counters began again at 0
    by_tier = {t: n - (0 if restarted else before.get(t, 0)) for t, n in after.items()}
    wrong = sum(t != [want[i]] * requests[i].n for i, t in texts.items())
    served = result.completed + result.hung_up
    return PhaseReport(
        fault=fault,
        phase=phase,
        requests=len(requests),
        completed=len(texts),
        hung_up=result.hung_up + (retried.hung_up if retried else 0),
        aborted=len(result.aborted),
        errors=tuple(errors),
        statuses=dict(statuses),
        wrong=wrong,
        requests_per_s=served / result.elapsed_s if result.elapsed_s else 0.0,
        ttft_p50_s=percentile(result.ttft_s, 0.5),
        ttft_p99_s=percentile(result.ttft_s, 0.99),
        hit_tokens=sum(by_tier.values()),
        hit_tokens_by_tier=by_tier,
        cached_tokens=sum(cached.values()),
        later_cached=sum(n for i, n in cached.items() if i in started_after),
    )


def disk_files(root: Path) -> dict[Path, int]:
    """Block files of a disk tier folder and their sizes (temp files left out)."""
    out = {}
    for path in root.glob("*/*/*.kv"):
        with contextlib.suppress(FileNotFoundError):  # evicted meanwhile
            out[path] = path.stat().st_size
    return out


def disk_used_bytes(url: str) -> int | None:
    stats = cache_stats(url)
    return None if stats is None else stats["occupancy"]["disk"]["used_bytes"]


def disk_bytes_match(url: str, root: Path, timeout_s: float = 30) -> bool:
    """Whether the disk tier's byte count comes to equal its files' (the writer thread may still
    be finishing a spill), within `timeout_s`."""
    try:
        wait_for(lambda: disk_used_bytes(url) == sum(disk_files(root).values()), timeout_s, "")
    except AssertionError:
        return False
    return True
