"""Engine exceptions and failed samples as HTTP errors."""

from __future__ import annotations

from typing import Protocol

from api.errors import ApiError


class Sample(Protocol):
    """A sample's end, as a delta or a whole completion carries it."""

    finish_reason: str | None
    error: str | None


def as_api_error(exc: Exception) -> Exception:
    """Engine exceptions -> HTTP errors (request too large: 400, overloaded: 429, dead: 503)."""
    from engine.async_engine import EngineDead, EngineOverloaded
    from engine.request import RequestTooLarge

    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RequestTooLarge):
        return ApiError(400, str(exc), param="max_tokens", code="kv_capacity_exceeded")
    if isinstance(exc, EngineOverloaded):
        return ApiError(429, f"Server is at capacity: {exc}; retry later", code="queue_full")
    if isinstance(exc, EngineDead):
        return ApiError(503, f"The engine is unavailable: {exc}", code="engine_unavailable")
    if isinstance(exc, ValueError):
        return ApiError(400, str(exc), code="invalid_request")
    return exc


def raise_if_failed(sample: Sample) -> None:
    """A sample the engine ended with an error (its grammar rejected a token): the request fails
    with that message, as a JSON error (whole) or an SSE error event (streamed)."""
    if sample.finish_reason == "error":
        message = sample.error or "the output constraint failed"
        raise ApiError(422, f"Generation failed: {message}", code="generation_error")
