"""Cache analytics and administration: stats, lookup (any caller, own namespace only); hottest
prefixes, flush, pin, unpin (admin key)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Query, Request
from pydantic import Field

from api.auth import Caller, identify, require_admin
from api.cache.report import cache_report
from api.errors import ApiError, parse_body
from api.observability.pools import block_counts
from api.openai.protocol import LookupRequest, _Request
from api.serving.input_checks import check_model
from api.serving.request_builder import encode
from api.state import ServerState, state_of
from engine.kv.admin import Flush, HottestPrefixes, Lookup, Pin, Unpin
from radixcache.stats import PrefixInfo

router = APIRouter(prefix="/v1/cache")


class FlushRequest(_Request):
    cache_salt: str | None = Field(None, max_length=256)  # None: every namespace


def _prompt_ids(state: ServerState, req: LookupRequest) -> list[int]:
    if req.model is not None:
        check_model(req.model, state.served_names)
    if (req.prompt is None) == (req.messages is None):
        raise ApiError(400, "Give exactly one of 'prompt' and 'messages'", param="prompt")
    source = req.prompt if req.prompt is not None else req.chat_prompt()
    return encode(state.engine.tokenizer, state.templates, source).token_ids


async def _parse(request: Request, caller: Caller) -> tuple[ServerState, list[int], str]:
    state = state_of(request)
    req = parse_body(await request.body(), LookupRequest)
    return state, _prompt_ids(state, req), caller.cache_salt(req.cache_salt)


@router.get("/stats")
async def stats(
    request: Request, window_minutes: float = Query(5.0, gt=0, le=24 * 60)
) -> dict[str, Any]:
    state = state_of(request)
    caller = identify(state.config, request)
    counters = await asyncio.to_thread(state.counters)
    window = state.cache_delta(counters.cache, window_minutes * 60)
    report = cache_report(
        counters, window, window_minutes, state.started_at, state.flops_per_token, caller
    )
    report["prompt_cache_keys"] = state.prompt_cache_keys.view(caller).report()
    report["model"] = state.model_name
    report["generation_tokens_per_s"] = round(state.tokens_per_s(), 3)
    return report


@router.post("/lookup")
async def lookup(request: Request) -> dict[str, Any]:
    state = state_of(request)
    state, ids, salt = await _parse(request, identify(state.config, request))
    found = await asyncio.to_thread(state.engine.admin, Lookup(ids, salt))
    cached = min(sum(found.values()), len(ids))
    return {
        "prompt_tokens": len(ids),
        "cached_tokens": cached,
        "cached_tokens_by_tier": found,
        "uncached_tokens": len(ids) - cached,
    }


def _prefix_row(tok: Any, info: PrefixInfo) -> dict[str, Any]:
    return {
        "namespace": info.namespace.hex,
        "cache_salt": info.namespace.cache_salt,
        "num_tokens": info.num_tokens,
        "hits": info.hits,
        "tokens_saved": info.tokens_saved,
        "last_used": datetime.fromtimestamp(info.last_used, UTC).isoformat(),
        "locked": info.locked,
        "pinned": info.pinned,
        "preview": tok.decode(list(info.token_ids)),
    }


@router.get("/prefixes")
async def prefixes(
    request: Request,
    limit: int = Query(20, ge=1, le=1000),
    cache_salt: str | None = Query(None, max_length=256),
) -> dict[str, Any]:
    state = state_of(request)
    require_admin(state.config, request)
    infos = await asyncio.to_thread(state.engine.admin, HottestPrefixes(limit, cache_salt))
    tok = state.engine.tokenizer
    return {"object": "list", "data": [_prefix_row(tok, i) for i in infos]}


@router.post("/flush")
async def flush(request: Request) -> dict[str, Any]:
    state = state_of(request)
    require_admin(state.config, request)
    body = await request.body()
    req = parse_body(body, FlushRequest) if body.strip() else FlushRequest()
    blocks = await asyncio.to_thread(state.engine.admin, Flush(req.cache_salt))
    return {"flushed_blocks": blocks, "cache_salt": req.cache_salt}


async def _admin_prompt_op(request: Request, pin: bool) -> tuple[int, int]:
    """Pins or unpins the body's prompt (admin only) -> (tokens, prompt tokens)."""
    caller = require_admin(state_of(request).config, request)
    state, ids, salt = await _parse(request, caller)
    op = Pin(ids, salt) if pin else Unpin(ids, salt)
    tokens = await asyncio.to_thread(state.engine.admin, op)
    return tokens, len(ids)


@router.get("/integrity")
async def integrity(request: Request) -> dict[str, Any]:
    """Admin: recomputes the cache's invariants now and reports the block counts (for soak
    tests and operators: when idle, nothing should be referenced)."""
    state = state_of(request)
    require_admin(state.config, request)
    error = await asyncio.to_thread(state.engine.integrity_error)
    snap = await asyncio.to_thread(state.engine.snapshot)
    return {
        "ok": error is None,
        "error": error,
        "blocks": block_counts(snap.cache),
        "requests": {"running": snap.running, "waiting": snap.waiting},
        "in_flight": state.engine.in_flight,
    }


@router.post("/pin")
async def pin(request: Request) -> dict[str, Any]:
    tokens, prompt_tokens = await _admin_prompt_op(request, pin=True)
    return {"pinned_tokens": tokens, "prompt_tokens": prompt_tokens}


@router.post("/unpin")
async def unpin(request: Request) -> dict[str, Any]:
    tokens, prompt_tokens = await _admin_prompt_op(request, pin=False)
    return {"unpinned_tokens": tokens, "prompt_tokens": prompt_tokens}
