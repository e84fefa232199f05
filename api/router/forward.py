"""One request through the router, whatever its protocol: choose a replica, forward, retry
elsewhere while nothing has been answered yet, then pass the answer back whole or streamed.

A request may name where it must or should go (`Outbound.holder`: the replica that holds its
conversation), or be a search (`Outbound.search`: a stored response's id nobody has told the
router about: the least-loaded replica first, then each other while they answer that the id is
not theirs)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
from fastapi.responses import Response, StreamingResponse

from api.errors import ApiError
from api.router.affinity import AffinityKey
from api.router.conversations import StreamIdScanner, response_id_of_body
from api.router.policy import Decision
from api.router.prompt_ids import NO_PROMPT, PromptIds
from api.router.proxy import Opened, UpstreamFailed, Usage, error_event, open_upstream
from api.router.replicas import Replica
from api.router.state import RouterState

REPLICA_HEADER = "x-radixcache-replica"  # which replica answered (r0, r1, ... in --replica order)


NotHere = Callable[[int, bytes], bool]  # (status, body) of a 4xx: "this replica lacks the id"


@dataclass(frozen=True)
class Outbound:
    method: str
    path: str  # with its query string
    body: bytes
    headers: dict[str, str]
    key: AffinityKey | None = None  # the request's prompt_cache_key (within its tenant)
    prompt: PromptIds = NO_PROMPT
    holder: str | None = None  # the replica holding the conversation ...
    holder_only: bool = False  # ... and the only one that can answer (its store is its own)
    search: NotHere | None = None  # the id is unknown: ask replica after replica
    learn_ids: bool = False  # a Responses answer: note its id -> this replica
    error_event: Callable[[str], bytes] = error_event  # ends a stream whose replica failed


async def forward(state: RouterState, out: Outbound) -> Response:
    tried: set[str] = set()
    failures, route_us, cpu_us = 0, 0.0, out.prompt.cpu_us
    missed: Response | None = None  # the last "not here" answer, if every replica gave one
    while failures < state.config.max_attempts:
        candidates = _candidates(state, out, tried)
        if not candidates:
            break
        t0, c0 = time.perf_counter(), time.thread_time()
        decision = _choose(state, out, candidates)
        r = decision.replica
        tried.add(r.name)
        r.load += 1
        r.sent(out.prompt.ids)  # before the replica answers: a request for the same prefix follows
        if out.key is not None:
            state.affinity.learn(out.key, r.name)  # likewise: the key's next request follows it
        route_us += (time.perf_counter() - t0) * 1e6
        cpu_us += (time.thread_time() - c0) * 1e6
        if out.prompt.tail:
            state.spawn(_index_tail(state, r, out.prompt))
        try:
            opened = await open_upstream(
                state.client, r.spec.url + out.path, out.body, out.headers, out.method
            )
        except UpstreamFailed:
            r.load -= 1
            r.failures += 1
            failures += 1
            state.take_out(r)  # the health check puts it back when it answers again
            continue
        state.overhead.add(out.prompt.wall_us, route_us, cpu_us)
        r.requests += 1
        r.decisions[decision.reason] += 1
        state.decisions[decision.reason] += 1
        r.predicted_cached_tokens += decision.predicted_tokens
        status = opened.response.status_code
        if out.search is not None and status in (400, 404):
            answer = await _whole(state, r, opened, out)
            if out.search(status, answer.body):
                missed = answer  # not this replica's: ask the next one
                continue
            return answer
        if status == 200 and _is_stream(opened.response):
            return StreamingResponse(
                _relay(state, r, opened, out),
                media_type="text/event-stream",
                headers={REPLICA_HEADER: r.name},
            )
        return await _whole(state, r, opened, out)
    if missed is not None:
        return missed
    state.unrouted += 1
    raise ApiError(503, "No replica could take the request", code="no_replica")


def _candidates(state: RouterState, out: Outbound, tried: set[str]) -> list[Replica]:
    candidates = state.candidates(tried)
    if out.holder_only and out.holder is not None:
        held = [r for r in candidates if r.name == out.holder]
        # the holder is down or failed: no other replica has the conversation; one of them
        # answers that it does not know the id (the replica's own 4xx, not the router's 503)
        return held or candidates[:1]
    return candidates


def _choose(state: RouterState, out: Outbound, candidates: list[Replica]) -> Decision:
    holder = next((r for r in candidates if r.name == out.holder), None)
    if holder is not None and out.holder_only:
        return Decision(holder, "conversation", holder.match(out.prompt.ids))
    if out.search is not None and holder is None:
        r = min(candidates, key=lambda r: r.load)
        return Decision(r, "id_search", r.match(out.prompt.ids))
    if holder is None and out.key is not None:
        name = state.affinity.home(out.key)
        holder = next((r for r in candidates if r.name == name), None)
    return state.router.choose(candidates, out.prompt.ids, holder)


def _is_stream(resp: httpx.Response) -> bool:
    return resp.headers.get("content-type", "").startswith("text/event-stream")


async def _index_tail(state: RouterState, r: Replica, prompt: PromptIds) -> None:
    """Tokenizes a routed prompt's tail and tells the replica's index the whole prompt."""
    t0 = time.perf_counter()
    tail = await asyncio.to_thread(state.tokenizer.segments.encode_array, prompt.tail)
    r.sent(prompt.ids + tail)
    state.overhead.add_deferred((time.perf_counter() - t0) * 1e6)


async def _whole(state: RouterState, r: Replica, opened: Opened, out: Outbound) -> Response:
    resp = opened.response
    try:
        body = opened.first + b"".join([chunk async for chunk in opened.chunks])
    except httpx.HTTPError as exc:
        r.failures += 1
        raise ApiError(
            502, f"The replica failed mid-response: {exc}", code="replica_failed"
        ) from exc
    finally:
        r.load -= 1
        await resp.aclose()
    _count_usage(r, body)
    if out.learn_ids and resp.status_code == 200:
        rid = response_id_of_body(body)
        if rid is not None:
            state.conversations.learn(rid, r.name)
    media = resp.headers.get("content-type", "application/json")
    return Response(body, resp.status_code, media_type=media, headers={REPLICA_HEADER: r.name})


async def _relay(
    state: RouterState, r: Replica, opened: Opened, out: Outbound
) -> AsyncIterator[bytes]:
    """Passes the replica's stream through chunk by chunk; a failure mid-way ends it with an
    error event (never a hang: the read timeout bounds a silent replica)."""
    usage = Usage()
    ids = StreamIdScanner(done=not out.learn_ids)
    try:
        async for chunk in _chunks(opened):
            usage.scan(chunk)
            if ids.feed(chunk) is not None:
                state.conversations.learn(ids.response_id, r.name)
            yield chunk
    except httpx.HTTPError as exc:
        r.failures += 1
        yield out.error_event(f"The replica failed mid-stream: {type(exc).__name__}")
    finally:
        r.load -= 1
        await opened.response.aclose()
        r.prompt_tokens += usage.prompt_tokens
        r.reported_cached_tokens += usage.cached_tokens


async def _chunks(opened: Opened) -> AsyncIterator[bytes]:
    yield opened.first
    async for chunk in opened.chunks:
        yield chunk


def _count_usage(r: Replica, body: bytes) -> None:
    usage = Usage()
    usage.scan(body)
    r.prompt_tokens += usage.prompt_tokens
    r.reported_cached_tokens += usage.cached_tokens
