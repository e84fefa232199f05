"""The one place the server chooses its Responses store from its settings."""

from __future__ import annotations

from api.config import ApiConfig
from api.openai.responses.store import ResponseStore
from api.openai.responses.store_sqlite import SqliteResponseStore


def open_store(config: ApiConfig) -> ResponseStore:
    """SQLite at config.responses_store_path (in memory when None)."""
    return SqliteResponseStore(
        config.responses_store_path, config.responses_ttl_s, config.responses_max
    )
