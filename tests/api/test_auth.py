"""API keys, the admin key, and tenant isolation of the cache (requests, lookups, previews)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.api.servers import ADMIN_KEY, BLOCK_SIZE, Server


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture()
def anon(auth_server: Server):
    with httpx.Client(base_url=auth_server.url, timeout=60.0) as client:
        yield client


def test_api_key_required(anon, auth_server) -> None:
    body = {"model": auth_server.model, "prompt": "hi", "max_tokens": 2}
    r = anon.post("/v1/completions", json=body)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = anon.post("/v1/completions", json=body, headers=bearer("sk-wrong"))
    assert r.status_code == 401
    assert anon.get("/v1/models").status_code == 401
    assert anon.post("/v1/completions", json=body, headers=bearer("sk-alice")).status_code == 200
    assert anon.post("/v1/completions", json=body, headers=bearer(ADMIN_KEY)).status_code == 200
    assert anon.get("/health").status_code == 200  # probes need no key


def test_openai_client_with_key(auth_server) -> None:
    good = openai.OpenAI(base_url=auth_server.url + "/v1", api_key="sk-bob", max_retries=0)
    assert good.models.list().data
    bad = openai.OpenAI(base_url=auth_server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/cache/prefixes"),
        ("POST", "/v1/cache/flush"),
        ("POST", "/v1/cache/pin"),
        ("POST", "/v1/cache/unpin"),
    ],
)
def test_admin_endpoints_need_admin_key(anon, auth_server, method, path) -> None:
    body = {"prompt": "x" * 40} if path.endswith("pin") else {}
    assert anon.request(method, path, json=body).status_code == 401
    r = anon.request(method, path, json=body, headers=bearer("sk-alice"))
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert anon.request(method, path, json=body, headers=bearer(ADMIN_KEY)).status_code == 200


def test_tenants_never_share_prefixes(anon, auth_server) -> None:
    prompt = "shared system prompt that both tenants send " * 3
    body = {"model": auth_server.model, "prompt": prompt, "max_tokens": 2, "temperature": 0}

    def cached(key: str) -> int:
        r = anon.post("/v1/completions", json=body, headers=bearer(key))
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    def looked_up(key: str) -> int:
        r = anon.post("/v1/cache/lookup", json={"prompt": prompt}, headers=bearer(key))
        assert r.status_code == 200, r.text
        return r.json()["cached_tokens"]

    assert looked_up("sk-alice") == 0
    assert cached("sk-alice") == 0
    assert looked_up("sk-alice") >= 4 * BLOCK_SIZE
    assert looked_up("sk-bob") == 0  # bob cannot probe alice's cache
    assert cached("sk-bob") == 0  # ... nor hit it
    assert cached("sk-alice") > 0 and cached("sk-bob") > 0
    # a tenant cannot reach another tenant's namespace by choosing a cache_salt
    salted = {"prompt": prompt, "cache_salt": "tenant:alice"}
    assert (
        anon.post("/v1/cache/lookup", json=salted, headers=bearer("sk-bob")).json()["cached_tokens"]
        == 0
    )
    # stats list only the caller's own namespaces; the admin sees all of them with previews
    stats = anon.get("/v1/cache/stats", headers=bearer("sk-bob")).json()
    assert stats["namespaces"] and all(
        ns["cache_salt"].startswith("tenant:bob") for ns in stats["namespaces"]
    )
    rows = anon.get("/v1/cache/prefixes", headers=bearer(ADMIN_KEY)).json()["data"]
    salts = {row["cache_salt"] for row in rows}
    assert {"tenant:alice", "tenant:bob"} <= salts


def test_cache_salt_isolates_without_keys(http, server) -> None:
    prompt = "a request salted per user, long enough for blocks " * 2
    body = {"model": server.model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    first = http.post("/v1/completions", json={**body, "cache_salt": "u1"}).json()
    other = http.post("/v1/completions", json={**body, "cache_salt": "u2"}).json()
    same = http.post("/v1/completions", json={**body, "cache_salt": "u1"}).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert same["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
