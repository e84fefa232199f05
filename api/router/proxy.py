"""Forwarding one request to one replica: connect, status, and the first byte decide whether the
router may retry elsewhere; after the first byte a failure ends the stream with an error event."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from api.anthropic.errors import error_body

_USAGE = re.compile(rb'"prompt_tokens":(\d+).*?"cached_tokens":(\d+)')
# Responses: "input_tokens":N,"input_tokens_details":{"cached_tokens":M}; Anthropic: the tokens
# read from the cache are apart from "input_tokens" (the rest of the prompt)
_INPUT = re.compile(rb'"input_tokens":\s*(\d+)')
_INPUT_CACHED = re.compile(rb'"(?:cached_tokens|cache_read_input_tokens)":\s*(\d+)')
# what a replica needs of the caller's headers: its key (OpenAI's Bearer, Anthropic's x-api-key),
# the body's type, and Anthropic's version and beta flags
FORWARDED = (
    "authorization",
    "x-api-key",
    "content-type",
    "accept",
    "anthropic-version",
    "anthropic-beta",
)


class UpstreamFailed(Exception):
    """The replica failed before sending anything: another replica may take the request."""


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def scan(self, data: bytes) -> None:
        """Reads the usage out of a response body or a streamed chunk, if it carries one."""
        if b'"prompt_tokens"' in data and b'"cached_tokens"' in data:
            for found in _USAGE.finditer(data):
                self.prompt_tokens, self.cached_tokens = int(found[1]), int(found[2])
        elif b'"input_tokens"' in data:
            inputs, cached = _INPUT.findall(data), _INPUT_CACHED.findall(data)
            self.cached_tokens = int(cached[-1]) if cached else 0
            self.prompt_tokens = int(inputs[-1])
            if b'"cache_read_input_tokens"' in data:
                self.prompt_tokens += self.cached_tokens


@dataclass
class Opened:
    response: httpx.Response
    first: bytes  # the first chunk of the body (empty for an empty body)
    chunks: AsyncIterator[bytes]


async def open_upstream(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: dict[str, str],
    method: str = "POST",
) -> Opened:
    """Sends the request and waits for the first body chunk. Raises UpstreamFailed on a connection
    error, a 5xx or a body that fails before its first byte; 4xx answers are passed back as they are."""
    request = client.build_request(method, url, content=body or None, headers=headers)
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise UpstreamFailed(f"{type(exc).__name__}: {exc}") from exc
    if response.status_code >= 500:
        await response.aclose()
        raise UpstreamFailed(f"status {response.status_code}")
    chunks = response.aiter_raw()
    try:
        first = await anext(chunks, b"")
    except httpx.HTTPError as exc:
        await response.aclose()
        raise UpstreamFailed(f"{type(exc).__name__}: {exc}") from exc
    return Opened(response, first, chunks)


def error_event(message: str) -> bytes:
    """The SSE event that ends a chat or completions stream whose replica failed mid-way (then
    [DONE])."""
    err = {"error": {"message": message, "type": "upstream_error", "code": "replica_failed"}}
    return f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()


def responses_error_event(message: str) -> bytes:
    """The same for a Responses stream (its `error` event)."""
    err = {"type": "error", "code": "replica_failed", "message": message, "param": None}
    return f"event: error\ndata: {json.dumps(err)}\n\n".encode()


def anthropic_error_event(message: str) -> bytes:
    """The same for a Messages stream (Anthropic's `error` event)."""
    return f"event: error\ndata: {json.dumps(error_body(502, message))}\n\n".encode()


def forward_headers(incoming: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in incoming.items() if k.lower() in FORWARDED}
