"""RedisResponseStore against a real redis-server (and a real 3-master cluster): records round
trip, the bound drops the oldest, every record carries its TTL, a down server is an error the
route turns into a 503 (never a crash), and the factory picks Redis when given a URL."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from api.config import ApiConfig
from api.openai.responses.store import StoredResponse
from api.openai.responses.store_factory import response_store_for
from api.openai.responses.store_redis import (
    KEY_PREFIX,
    RedisResponseStore,
    ResponseStoreUnavailable,
)
from api.openai.responses.store_sqlite import SqliteResponseStore
from storage.config import TierConfig
from tests.api.servers import engine_config, start_server
from tests.redis_cluster import running_cluster
from tests.redis_server import RedisServer


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def record(n: int, tenant: str | None = "acme") -> StoredResponse:
    return StoredResponse(
        id=f"resp_{n}",
        tenant=tenant,
        created_at=1_700_000_000.0 + n,
        body={"id": f"resp_{n}", "object": "response", "output": [{"type": "message"}]},
        conversation=[{"role": "user", "content": f"turn {n}"}, {"type": "message", "id": "m"}],
        token_ids=[1, 2, 3, n],
    )


def test_put_get_delete_round_trip_every_field(redis_server: RedisServer) -> None:
    store = RedisResponseStore(redis_server.url, max_responses=10, ttl_s=3600)
    try:
        assert store.get("resp_1") is None
        store.put(record(1))
        store.put(record(2, tenant=None))
        assert store.get("resp_1") == record(1)
        assert store.get("resp_2") == record(2, tenant=None)  # no tenant stays None
        assert store.delete("resp_1") is True
        assert store.get("resp_1") is None and store.delete("resp_1") is False
        client = redis_server.client()
        assert client.zrange(store.index_key, 0, -1) == [b"resp_2"]
        # the store's keys never look like the KV tier's (`radixcache:<ns>:<hash>`)
        assert all(k.startswith(KEY_PREFIX.encode()) for k in client.keys("*"))
    finally:
        store.close()


def test_the_bound_drops_the_oldest_records_first(redis_server: RedisServer) -> None:
    clock = Clock()
    store = RedisResponseStore(redis_server.url, max_responses=3, ttl_s=3600, clock=clock)
    try:
        for n in range(5):
            clock.now += 1
            store.put(record(n))
        assert [store.get(f"resp_{n}") is not None for n in range(5)] == [0, 0, 1, 1, 1]
        client = redis_server.client()
        assert client.zcard(store.index_key) == 3
        assert client.exists(store.record_key("resp_0"), store.record_key("resp_1")) == 0
    finally:
        store.close()


def test_every_record_expires_ttl_after_it_was_written(redis_server: RedisServer) -> None:
    clock = Clock()
    store = RedisResponseStore(redis_server.url, max_responses=10, ttl_s=120, clock=clock)
    client = redis_server.client()
    try:
        store.put(record(1))
        ttl = client.ttl(store.record_key("resp_1"))
        assert 115 <= ttl <= 120
        assert 0 < client.ttl(store.index_key) <= 121  # the index never outlives its records
        # a record written later has its own full TTL; the index forgets the expired one
        clock.now += 121
        client.delete(store.record_key("resp_1"))  # what Redis did at its TTL
        store.put(record(2))
        assert client.zrange(store.index_key, 0, -1) == [b"resp_2"]
        assert 115 <= client.ttl(store.record_key("resp_2")) <= 120
    finally:
        store.close()


def test_a_down_server_is_an_error_not_a_crash_and_it_recovers(
    redis_server: RedisServer,
) -> None:
    store = RedisResponseStore(redis_server.url, max_responses=10, ttl_s=60, socket_timeout_s=0.5)
    try:
        store.put(record(1))
        redis_server.kill()
        with pytest.raises(ResponseStoreUnavailable, match="response store") as err:
            store.get("resp_1")
        assert err.value.status == 503  # an ApiError: the route answers a 503
        with pytest.raises(ResponseStoreUnavailable):
            store.put(record(2))
        with pytest.raises(ResponseStoreUnavailable):
            store.delete("resp_1")
        redis_server.start()  # same port, empty data
        assert store.get("resp_1") is None
        store.put(record(3))
        assert store.get("resp_3") == record(3)
    finally:
        store.close()


def test_a_password_in_the_url_is_not_in_the_error(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, password="s3cret")
    store = RedisResponseStore(server.url, max_responses=10, ttl_s=60, socket_timeout_s=0.5)
    try:
        with pytest.raises(ResponseStoreUnavailable) as err:
            store.get("resp_1")  # never started
        assert "s3cret" not in str(err.value)
    finally:
        store.close()


def test_a_cluster_keeps_the_store_in_one_slot(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        config = ApiConfig(responses_max=2, responses_ttl_s=60)
        store = response_store_for(config, cluster.url)
        try:
            assert isinstance(store, RedisResponseStore)
            for n in range(3):
                store.put(record(n))
            assert store.get("resp_0") is None and store.get("resp_2") == record(2)
            owner = cluster.owner(store.index_key)
            assert owner is cluster.owner(store.record_key("resp_2"))
            assert 55 <= owner.client().ttl(store.record_key("resp_2")) <= 60
            assert store.delete("resp_2") and store.get("resp_2") is None
        finally:
            store.close()


def test_without_a_url_the_factory_opens_the_sqlite_store(tmp_path: Path) -> None:
    store = response_store_for(ApiConfig(responses_store_path=tmp_path / "r.db"), None)
    try:
        assert isinstance(store, SqliteResponseStore)
        store.put(record(1))
        assert store.get("resp_1") == record(1) and (tmp_path / "r.db").exists()
    finally:
        store.close()


def test_a_server_whose_redis_is_down_answers_503(
    redis_server: RedisServer, tiny_llama: Path
) -> None:
    """A replica served with --redis-url keeps its responses there; with Redis gone, the
    routes that need the store answer 503 in OpenAI's shape, and the server stays up."""
    tiers = TierConfig(redis_url=redis_server.url, redis_timeout_s=0.2)
    server = start_server(engine_config(tiny_llama, tiers=tiers), ApiConfig())
    try:
        assert isinstance(server.state.responses, RedisResponseStore)
        body = {"model": server.model, "input": "hello", "max_output_tokens": 2}
        made = httpx.post(f"{server.url}/v1/responses", json=body, timeout=60)
        assert made.status_code == 200
        redis_server.kill()
        got = httpx.get(f"{server.url}/v1/responses/{made.json()['id']}", timeout=60)
        assert got.status_code == 503
        assert got.json()["error"]["code"] == "store_unavailable"
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    finally:
        server.stop()
