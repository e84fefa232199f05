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


def test_stats_and_metrics_report_each_layer_type(base_server: Server) -> None:
    """Gemma's sliding-window layers keep their own pool: /v1/cache/stats and /metrics report
    both pools' blocks and the tokens each kind of layer found cached."""
    prompt = "a repeated head, long enough to outgrow an 8-token window " * 2
    with httpx.Client(base_url=base_server.url, timeout=60.0) as http:
        body = {"model": base_server.model, "max_tokens": 2, "temperature": 0, "prompt": prompt}
        for _ in range(2):  # the second one hits the first one's blocks
            assert http.post("/v1/completions", json=body).status_code == 200
        layers = http.get("/v1/cache/stats").json()["layer_types"]
        full, window = layers["full_attention"], layers["sliding_window"]
        assert window["window"] == 8 and 0 < window["num_blocks"] <= full["num_blocks"]
        assert full["cached"] >= window["cached"] > 0
        assert full["hit_tokens"] >= window["hit_tokens"] > 32
        metrics = http.get("/metrics").text
    sample = 'radixcache_prefix_cache_layer_type_hits_tokens_total{layer_type="sliding_window"}'
    assert f"{sample} {float(window['hit_tokens'])}" in metrics
    assert (
        'radixcache_cache_layer_type_blocks{layer_type="full_attention",state="cached"}' in metrics
    )
