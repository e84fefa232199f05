"""A Redis that requires a password: `redis://:PASSWORD@host` works end to end, and the password
never appears in the server's output, stats, metrics or errors, also while Redis is down."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from storage.config import TierConfig
from storage.redis_nodes import redacted_url
from tests.api.servers import flush_until_in_tier, fresh_text
from tests.redis_server import RedisServer
from tests.serve_process import tiny_redis_serve

SECRET = "s3cret-Pa55word"


def test_redacted_url_hides_only_the_password() -> None:
    assert redacted_url(f"redis://:{SECRET}@h:1/0") == "redis://:***@h:1/0"
    assert redacted_url(f"rediss://user:{SECRET}@h:1") == "rediss://user:***@h:1"
    assert redacted_url("redis://h:1/0") == "redis://h:1/0"
    assert SECRET not in repr(TierConfig(redis_url=f"redis://:{SECRET}@h:1"))


@pytest.mark.slow
def test_password_works_and_never_shows(tiny_llama: Path, tmp_path: Path) -> None:
    redis_server = RedisServer(tmp_path / "redis", password=SECRET)
    (tmp_path / "redis").mkdir()
    redis_server.start()
    server = tiny_redis_serve(tiny_llama, redis_server.url, tmp_path / "home")
    seen: list[str] = []
    try:
        server.wait_healthy()
        with httpx.Client(base_url=server.url, timeout=60) as client:
            prompt = fresh_text(64, seed=7)
            body = {"model": tiny_llama.name, "prompt": prompt, "max_tokens": 2, "temperature": 0}
            assert client.post("/v1/completions", json=body).status_code == 200
            flush_until_in_tier(client, prompt, "redis")
            seen += [client.get("/v1/cache/stats").text, client.get("/metrics").text]
            redis_server.kill()  # errors now: the tier degrades, the answers stay right
            assert client.post("/v1/completions", json=body).status_code == 200
            seen += [client.get("/v1/cache/stats").text, client.get("/metrics").text]
    finally:
        seen.append(server.terminate())
        redis_server.stop()
    assert "redis (redis://:***@" in seen[-1]  # the banner names the tier, redacted
    for text in seen:
        assert SECRET not in text
