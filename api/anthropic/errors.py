"""Anthropic's error shape, for every error of /v1/messages: {"type": "error", "error": {"type",
"message"}} with the HTTP status (the status -> type table is Anthropic's); a stream's failure is an
`event: error` of the same body (events.py)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from api.errors import ApiError
from api.serving.engine_errors import as_api_error

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def as_error(exc: Exception) -> ApiError:
    """Any failure as an ApiError: the engine's as api/serving maps them (overloaded: 429, dead:
    503, ...), an unexpected one a 500 naming its kind."""
    err = as_api_error(exc)
    if isinstance(err, ApiError):
        return err
    return ApiError(500, f"Internal error: {type(exc).__name__}: {exc}")


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(error_body(exc.status, exc.message), exc.status)
