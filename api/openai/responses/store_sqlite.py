"""The Responses store in SQLite (stdlib sqlite3): one file under the cache folder by default, or
in memory when no path is given. One connection behind a lock, so it is safe from any thread.
Bounded: a put beyond `max_responses` drops the oldest records; a record older than `ttl_s` is
gone (never returned, and purged on the next put)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from api.openai.responses.store import StoredResponse

Clock = Callable[[], float]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    tenant TEXT,
    created_at REAL NOT NULL,
    written_at REAL NOT NULL,
    body TEXT NOT NULL,
    conversation TEXT NOT NULL,
    token_ids TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_written ON responses (written_at);
"""


class SqliteResponseStore:
    def __init__(
        self,
        path: Path | None,
        ttl_s: float,
        max_responses: int,
        clock: Clock = time.time,
    ) -> None:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        target = ":memory:" if path is None else str(path)
        self._db = sqlite3.connect(target, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self._ttl_s = ttl_s
        self._max = max_responses
        self._clock = clock

    def put(self, record: StoredResponse) -> None:
        now = self._clock()
        row = (
            record.id,
            record.tenant,
            record.created_at,
            now,
            json.dumps(record.body),
            json.dumps(record.conversation),
            json.dumps(record.token_ids),
        )
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)", row)
            self._db.execute("DELETE FROM responses WHERE written_at <= ?", (now - self._ttl_s,))
            self._db.execute(
                "DELETE FROM responses WHERE id IN (SELECT id FROM responses "
                "ORDER BY written_at DESC, rowid DESC LIMIT -1 OFFSET ?)",
                (self._max,),
            )

    def get(self, response_id: str) -> StoredResponse | None:
        oldest = self._clock() - self._ttl_s
        with self._lock:
            row = self._db.execute(
                "SELECT id, tenant, created_at, body, conversation, token_ids FROM responses "
                "WHERE id = ? AND written_at > ?",
                (response_id, oldest),
            ).fetchone()
        if row is None:
            return None
        rid, tenant, created_at, body, conversation, token_ids = row
        return StoredResponse(
            rid,
            tenant,
            created_at,
            json.loads(body),
            json.loads(conversation),
            json.loads(token_ids),
        )

    def delete(self, response_id: str) -> bool:
        oldest = self._clock() - self._ttl_s
        with self._lock:
            cursor = self._db.execute(
                "DELETE FROM responses WHERE id = ? AND written_at > ?", (response_id, oldest)
            )
        return cursor.rowcount > 0

    def count(self) -> int:
        """Records held, expired ones not yet purged included."""
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
