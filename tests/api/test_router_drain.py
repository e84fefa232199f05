"""The router and a draining replica: a request the replica refuses before its first byte (503
while draining) is retried on another replica, the health check (the replicas' /ready) keeps new
requests off a draining replica, and puts it back once it serves again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.config import ApiConfig
from api.router.config import RouterConfig
from api.router.replicas import ReplicaSpec
from tests.api.router_peers import RouterHandle, start_router, wait_until
from tests.api.servers import Server, engine_config, start_server

HEADER = "x-radixcache-replica"


@pytest.fixture(scope="module")
def replicas(tiny_llama: Path) -> Iterator[list[Server]]:
    servers = [start_server(engine_config(tiny_llama), ApiConfig()) for _ in range(2)]
    yield servers
    for s in servers:
        s.stop()


def _router(replicas: list[Server], tiny_llama: Path, health_interval_s: float) -> RouterHandle:
    specs = tuple(ReplicaSpec(s.url) for s in replicas)
    config = RouterConfig(
        specs, tiny_llama, policy="round-robin", health_interval_s=health_interval_s
    )
    return start_router(config)


def _chat(router: RouterHandle, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"{router.url}/v1/chat/completions", json=body, timeout=60)


def test_a_request_refused_by_a_draining_replica_is_retried_on_another(
    replicas: list[Server], tiny_llama: Path
) -> None:
    router = _router(replicas, tiny_llama, health_interval_s=3600)  # no check in between
    try:
        assert httpx.post(f"{replicas[0].url}/admin/drain").status_code == 200
        answers = [_chat(router, replicas[0].model) for _ in range(4)]
        assert [a.status_code for a in answers] == [200] * 4
        assert {a.headers[HEADER] for a in answers} == {"r1"}  # round-robin's r0 turns moved
        stats = router.stats()["replicas"]
        assert stats["r0"]["failures"] == 1 and not stats["r0"]["healthy"]
        assert replicas[0].state.engine.in_flight == 0
    finally:
        httpx.delete(f"{replicas[0].url}/admin/drain")
        router.stop()


def test_the_health_check_keeps_requests_off_a_draining_replica_until_it_serves(
    replicas: list[Server], tiny_llama: Path
) -> None:
    router = _router(replicas, tiny_llama, health_interval_s=0.1)
    try:
        assert httpx.post(f"{replicas[1].url}/admin/drain").status_code == 200
        wait_until(lambda: not router.stats()["replicas"]["r1"]["healthy"], 30, "r1 out")
        answers = [_chat(router, replicas[0].model) for _ in range(4)]
        assert {a.headers[HEADER] for a in answers} == {"r0"}
        assert router.stats()["replicas"]["r1"]["failures"] == 0  # never even tried
        assert httpx.delete(f"{replicas[1].url}/admin/drain").status_code == 200
        wait_until(lambda: router.stats()["replicas"]["r1"]["healthy"], 30, "r1 back")
        answers = [_chat(router, replicas[0].model) for _ in range(4)]
        assert {a.headers[HEADER] for a in answers} == {"r0", "r1"}
    finally:
        httpx.delete(f"{replicas[1].url}/admin/drain")
        router.stop()
