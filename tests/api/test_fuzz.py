"""The server's own OpenAPI document, fuzzed (schemathesis): whatever the generated requests hold,
every answer is a 2xx or a 4xx with a JSON error body, never a 5xx or a hang, and the server is
healthy afterwards with nothing left referenced."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from api.config import ApiConfig
from tests.api.servers import Server, engine_config, start_server

ADMIN = {"Authorization": "Bearer sk-fuzz-admin"}
MAX_TOKENS = 4  # generation is not what is fuzzed: keep each case cheap
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")  # the others refuse max_tokens
STATUSES: dict[str, list[int]] = {}  # operation -> status codes seen


@pytest.fixture(scope="module")
def fuzz_server(tiny_llama: Path) -> Iterator[Server]:
    cfg = ApiConfig(api_keys={"sk-fuzz-tenant": "tenant"}, admin_key="sk-fuzz-admin")
    handle = start_server(engine_config(tiny_llama), cfg)
    yield handle
    handle.stop()


def _cheap(case: schemathesis.Case, model: str) -> None:
    """Half the bodies name the served model (so generation is reached), none runs long."""
    body = case.body
    if not isinstance(body, dict):
        return
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if isinstance(body.get(key), int) and body[key] > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if case.path in GENERATION_PATHS:
        body.setdefault("max_tokens", MAX_TOKENS)
    named = zlib.crc32(json.dumps(body, sort_keys=True, default=str).encode()) % 2
    if case.path == "/v1/responses":
        body.setdefault("max_output_tokens", MAX_TOKENS)
    if ("messages" in body or "prompt" in body or "input" in body) and named:
        body["model"] = model
    if isinstance(body.get("n"), int):
        body["n"] = min(body["n"], 2)


def _fuzz(operation: schemathesis.APIOperation, server: Server) -> None:
    """Hypothesis drives schemathesis' strategy for one operation directly (no pytest plugin:
    its hooks break with each pytest release that renames an internal, as 9.2 did)."""

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    @given(case=operation.as_strategy())
    def run(case: schemathesis.Case) -> None:
        _cheap(case, server.model)
        response = case.call(base_url=server.url, headers=ADMIN, timeout=60)
        assert response.status_code < 500, (case.method, case.path, case.body, response.text)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["message"] and error["type"], response.text
        STATUSES.setdefault(operation.label, []).append(response.status_code)

    run()


@pytest.mark.slow
def test_no_operation_answers_5xx(fuzz_server: Server) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    for operation in operations:
        _fuzz(operation, fuzz_server)
    assert set(STATUSES) == {op.label for op in operations}


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
