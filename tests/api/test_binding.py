"""Open on a network, closed by default: `radixcache serve` bound to a non-loopback address with no
keys serves the API to everyone but closes the admin endpoints (every tenant's prompt previews,
flush, pin) and the dashboard's admin view, unless --open-admin says otherwise; on loopback, local
mode keeps every caller admin."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from api.cli import admin_open, build_parser
from api.config import is_loopback
from tests.serve_process import ServeProcess

SECRET = "A-SECRET-PROMPT-OF-SOMEONE-ELSE " * 4


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True)]
    + [("0.0.0.0", False), ("::", False), ("192.0.2.1", False)],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("argv", "open_"),
    [([], True), (["--host", "0.0.0.0"], False), (["--host", "0.0.0.0", "--open-admin"], True)],
)
def test_keyless_callers_are_admins_only_on_loopback(argv: list[str], open_: bool) -> None:
    assert admin_open(build_parser().parse_args(["serve", *argv])) is open_


@dataclass
class Served:
    server: ServeProcess
    printed: str = ""  # everything it printed, once it has stopped


@contextmanager
def network_server(model: Path, home: Path, extra: list[str]) -> Iterator[Served]:
    """`radixcache serve --host 0.0.0.0` (reached here through loopback) that has served one
    completion of SECRET, so the cache holds someone's prompt."""
    args = ["--model", str(model), "--dtype", "float32", "--kv-memory", "4M", "--no-disk"]
    served = Served(
        ServeProcess([*args, "--host", "0.0.0.0", *extra, "--log-level", "warning"], home)
    )
    try:
        served.server.wait_healthy()
        body = {"model": model.name, "prompt": SECRET, "max_tokens": 2}
        r = httpx.post(served.server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        yield served
    finally:
        served.printed = served.server.terminate()


def test_network_binding_closes_the_admin_endpoints(tiny_llama: Path, tmp_path: Path) -> None:
    with network_server(tiny_llama, tmp_path, []) as served:
        client = httpx.Client(base_url=served.server.url, timeout=30)
        r = client.get("/v1/cache/prefixes")
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_closed", r.text
        assert "--admin-key" in r.json()["error"]["message"]
        assert client.post("/v1/cache/flush", json={}).status_code == 403
        data = client.get("/dashboard/data").json()
        assert data["caller"]["is_admin"] is False
        assert data["prefixes"] == []  # the previews would be everyone's prompts
    assert "admin endpoints and the dashboard's admin view are closed" in served.printed
    assert "--open-admin" in served.printed


def test_open_admin_flag_opens_them_and_the_banner_says_so(
    tiny_llama: Path, tmp_path: Path
) -> None:
    with network_server(tiny_llama, tmp_path, ["--open-admin"]) as served:
        client = httpx.Client(base_url=served.server.url, timeout=30)
        r = client.get("/v1/cache/prefixes")
        assert r.status_code == 200, r.text
        assert any("A-SECRET-PROMPT" in p["preview"] for p in r.json()["data"]), r.json()
        assert client.get("/dashboard/data").json()["caller"]["is_admin"] is True
    assert "--open-admin: every caller who can reach 0.0.0.0" in served.printed, served.printed


def test_admin_key_on_a_network_binding(tiny_llama: Path, tmp_path: Path) -> None:
    with network_server(tiny_llama, tmp_path, ["--admin-key", "sk-admin"]) as served:
        client = httpx.Client(base_url=served.server.url, timeout=30)
        assert client.get("/v1/cache/prefixes").status_code == 401
        r = client.get("/v1/cache/prefixes", headers={"Authorization": "Bearer sk-admin"})
        assert r.status_code == 200, r.text
    assert "admin key set" in served.printed, served.printed
