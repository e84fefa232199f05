"""Which store keeps the stored responses: Redis when the server was given a Redis URL (the KV
tier's: every replica behind a router then sees every conversation), else SQLite under the
cache folder (this replica's own)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from api.openai.responses.store import ResponseStore

DEFAULT_MAX_RESPONSES = 10_000
DEFAULT_TTL_S = 30 * 24 * 3600.0  # OpenAI keeps stored responses 30 days


@dataclass(frozen=True)
class ResponseStoreConfig:
    sqlite_path: Path  # used when redis_url is None
    redis_url: str | None = None
    max_responses: int = DEFAULT_MAX_RESPONSES
    ttl_s: float = DEFAULT_TTL_S


def response_store_for(config: ResponseStoreConfig) -> ResponseStore:
    if config.redis_url:
        from api.openai.responses.store_redis import RedisResponseStore

        return RedisResponseStore(config.redis_url, config.max_responses, config.ttl_s)
    from api.openai.responses.store_sqlite import SqliteResponseStore

    return SqliteResponseStore(config.sqlite_path, config.max_responses, config.ttl_s)
