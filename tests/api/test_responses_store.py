"""The Responses API's SQLite store: a record round-trips, the store keeps at most its bound
(oldest dropped first), a record expires after its TTL (an injected clock, no sleeps), a file
store survives a reopen, and threads may share it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from api.openai.responses.store import StoredResponse
from api.openai.responses.store_sqlite import SqliteResponseStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(n: int, tenant: str | None = "alice") -> StoredResponse:
    body = {"id": f"resp_{n}", "object": "response", "output": [{"type": "message"}]}
    conversation = [{"type": "message", "role": "user", "content": f"turn {n}"}]
    return StoredResponse(f"resp_{n}", tenant, 1000.0 + n, body, conversation, [1, 2, n])


def test_round_trip_and_delete() -> None:
    store = SqliteResponseStore(None, ttl_s=60, max_responses=10)
    store.put(record(1, tenant=None))
    assert store.get("resp_1") == record(1, tenant=None)
    assert store.get("resp_2") is None
    assert store.delete("resp_1") is True
    assert store.get("resp_1") is None
    assert store.delete("resp_1") is False
    store.close()


def test_bounded_oldest_dropped_first() -> None:
    clock = Clock()
    store = SqliteResponseStore(None, ttl_s=3600, max_responses=3, clock=clock)
    for n in range(5):
        clock.now += 1
        store.put(record(n))
    assert store.count() == 3
    assert [store.get(f"resp_{n}") is not None for n in range(5)] == [False, False, True, True, True]


def test_expires_after_ttl() -> None:
    clock = Clock()
    store = SqliteResponseStore(None, ttl_s=30, max_responses=10, clock=clock)
    store.put(record(1))
    clock.now += 29
    assert store.get("resp_1") is not None
    clock.now += 2
    assert store.get("resp_1") is None
    assert store.delete("resp_1") is False  # expired: as good as gone
    store.put(record(2))  # a put purges what expired
    assert store.count() == 1


def test_file_store_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "cache" / "responses.sqlite"
    store = SqliteResponseStore(path, ttl_s=60, max_responses=10)
    store.put(record(7))
    store.close()
    reopened = SqliteResponseStore(path, ttl_s=60, max_responses=10)
    assert reopened.get("resp_7") == record(7)
    reopened.close()


def test_shared_across_threads() -> None:
    store = SqliteResponseStore(None, ttl_s=60, max_responses=1000)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: store.put(record(n)), range(200)))
        found = list(pool.map(lambda n: store.get(f"resp_{n}"), range(200)))
    assert all(f is not None for f in found) and store.count() == 200
    store.close()
