"""The server's own OpenAPI document, fuzzed (schemathesis): whatever the generated requests hold,
every answer is a 2xx or a 4xx with a JSON error body, never a 5xx or a hang, and the server is
healthy afterwards with nothing left referenced."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from api.config import ApiConfig
from tests.api.servers import Server, engine_config, start_server

ADMIN = {"Authorization": "Bearer sk-fuzz-admin"}
MAX_TOKENS = 4  # generation is not what is fuzzed: keep each case cheap
STATUSES: dict[str, list[int]] = {}  # operation -> status codes seen


@pytest.fixture(scope="module")
def fuzz_server(tiny_llama: Path) -> Iterator[Server]:
    cfg = ApiConfig(api_keys={"sk-fuzz-tenant": "tenant"}, admin_key="sk-fuzz-admin")
    handle = start_server(engine_config(tiny_llama), cfg)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_server: Server) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


def _cheap(case: schemathesis.Case, model: str) -> None:
    """Half the bodies name the served model (so generation is reached), none runs long."""
    body = case.body
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(key), int) and body[key] > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if "messages" in body or "prompt" in body:
        body.setdefault("max_tokens", MAX_TOKENS)
        if hash(repr(body)) % 2:
            body["model"] = model
    if isinstance(body.get("n"), int):
        body["n"] = min(body["n"], 2)


@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_operation_answers_5xx(case: schemathesis.Case, fuzz_server: Server) -> None:
    _cheap(case, fuzz_server.model)
    response = case.call(base_url=fuzz_server.url, headers=ADMIN, timeout=60)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["message"] and error["type"], response.text
    STATUSES.setdefault(f"{case.method} {case.path}", []).append(response.status_code)


@pytest.mark.slow
def test_server_healthy_after_the_fuzzing(fuzz_server: Server) -> None:
    # the schema states the real constraints: generated bodies get through to the engine
    for op in ("POST /v1/completions", "POST /v1/chat/completions", "POST /v1/cache/lookup"):
        assert 200 in STATUSES.get(op, []), (op, STATUSES.get(op))
    with httpx.Client(base_url=fuzz_server.url, timeout=30, headers=ADMIN) as client:
        assert client.get("/health").status_code == 200
        body = {"model": fuzz_server.model, "prompt": "still fine", "max_tokens": 2}
        assert client.post("/v1/completions", json=body).status_code == 200
        report = client.get("/v1/cache/integrity").json()
    assert report["ok"], report["error"]
    assert report["blocks"]["referenced"] == 0 and report["in_flight"] == 0
