"""A base model (a tiny random Gemma 3 whose folder has no chat template) behind the server:
completions are served; chat is refused with a 400 that says why."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from api.config import ApiConfig
from tests.api.servers import Server, engine_config, start_server
from tests.tiny_models import make_tiny_gemma


@pytest.fixture(scope="module")
def base_server(tmp_path_factory) -> Iterator[Server]:
    _, folder = make_tiny_gemma(tmp_path_factory.mktemp("gemma"), "d32-mixed")
    handle = start_server(engine_config(folder), ApiConfig())
    yield handle
    handle.stop()


def test_completions_work_and_chat_is_a_clear_400(base_server: Server) -> None:
    with httpx.Client(base_url=base_server.url, timeout=60.0) as http:
        body = {"model": base_server.model, "max_tokens": 4, "temperature": 0}
        done = http.post("/v1/completions", json={**body, "prompt": "hello"})
        assert done.status_code == 200, done.text
        assert done.json()["usage"]["completion_tokens"] == 4
        chat = http.post(
            "/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "hi"}]}
        )
        assert chat.status_code == 400
        message = chat.json()["error"]["message"]
        assert "no chat template" in message and "/v1/completions" in message
