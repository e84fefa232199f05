"""What the Responses API keeps of a stored response, and the store it keeps it in (SQLite under
the cache folder by default, Redis when the server has --redis-url). A store is bounded (at most
`max_responses`, the oldest dropped first) and every record expires `ttl_s` after it was written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class StoredResponse:
    id: str  # "resp_..."
    tenant: str | None  # the caller's tenant (api.auth.Caller.tenant): only it sees the record
    created_at: float  # unix seconds
    body: dict[str, Any]  # the Response object as returned to the client (GET answers it)
    conversation: list[dict[str, Any]]  # input items so far + this response's output items
    token_ids: list[int]  # this turn's prompt + output token ids


class ResponseStore(Protocol):
    """Blocking calls (run them off the event loop)."""

    def put(self, record: StoredResponse) -> None: ...

    def get(self, response_id: str) -> StoredResponse | None:
        """None when unknown or expired."""
        ...

    def delete(self, response_id: str) -> bool:
        """Whether it was there."""
        ...

    def close(self) -> None: ...
