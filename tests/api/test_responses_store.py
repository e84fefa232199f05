"""The Responses API's SQLite store: a record round-trips, the store keeps at most its bound
(oldest dropped first), a record expires after its TTL (an injected clock, no sleeps), a file
store survives a reopen, threads may share it, and `serve` keeps it under the cache folder."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from api.cli import api_config, build_parser
from api.openai.responses.store import StoredResponse
from api.openai.responses.store_factory import response_store_for
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
    assert [store.get(f"resp_{n}") is not None for n in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]


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


def test_serve_keeps_responses_under_the_cache_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RADIXCACHE_HOME", str(tmp_path))
    config = api_config(build_parser().parse_args(["serve"]))
    assert config.responses_store_path == tmp_path / "responses.sqlite"
    assert config.responses_ttl_s == 30 * 24 * 3600
    store = response_store_for(config)
    store.put(record(3))
    store.close()
    assert SqliteResponseStore(config.responses_store_path, 60, 10).get("resp_3") == record(3)
    args = ["serve", "--responses-store", str(tmp_path / "r.db"), "--responses-max", "5"]
    config = api_config(build_parser().parse_args(args))
    assert config.responses_store_path == tmp_path / "r.db" and config.responses_max == 5


def test_replacing_a_record_makes_it_the_newest() -> None:
    clock = Clock()
    store = SqliteResponseStore(None, ttl_s=3600, max_responses=2, clock=clock)
    for n in (1, 2, 1, 3):  # resp_1 written again after resp_2: resp_2 is now the oldest
        clock.now += 1
        store.put(record(n))
    assert store.get("resp_2") is None and store.get("resp_1") is not None
    assert store.count() == 2
