"""The one place the server chooses its Responses store from its settings: Redis when the server
was given a Redis URL (the KV tier's `--redis-url`: every replica behind a router then sees every
conversation, and the router runs with --shared-response-store), else SQLite at
config.responses_store_path (this replica's own; in memory when None)."""

from __future__ import annotations

from api.config import ApiConfig
from api.openai.responses.store import ResponseStore


def response_store_for(config: ApiConfig, redis_url: str | None = None) -> ResponseStore:
    if redis_url:
        from api.openai.responses.store_redis import RedisResponseStore

        return RedisResponseStore(redis_url, config.responses_max, config.responses_ttl_s)
    from api.openai.responses.store_sqlite import SqliteResponseStore

    return SqliteResponseStore(
        config.responses_store_path, config.responses_ttl_s, config.responses_max
    )
