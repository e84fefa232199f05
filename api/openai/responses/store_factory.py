"""Which store keeps the stored responses: Redis when the server was given a Redis URL (the KV
tier's `--redis-url`: every replica behind a router then sees every conversation, and the router
runs with --shared-response-store), else open_store's SQLite (this replica's own)."""

from __future__ import annotations

from api.config import ApiConfig
from api.openai.responses.store import ResponseStore


def response_store_for(config: ApiConfig, redis_url: str | None = None) -> ResponseStore:
    if redis_url:
        from api.openai.responses.store_redis import RedisResponseStore

        return RedisResponseStore(redis_url, config.responses_max, config.responses_ttl_s)
    from api.openai.responses.open_store import open_store

    return open_store(config)
