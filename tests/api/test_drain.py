"""The drain: an operator's POST /admin/drain and SIGTERM. Readiness fails at once, new requests
get 503 with Retry-After, liveness and metrics keep answering, running streams finish whole; after
SIGTERM the process exits once drained, or when --drain-timeout runs out."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from api.config import ApiConfig
from api.lifecycle.drain import Drain
from tests.api.servers import Server, engine_config, fresh_text, start_server
from tests.redis_server import RedisServer
from tests.serve_process import ServeProcess


@pytest.fixture(scope="module")
def drainable(tiny_llama: Path) -> Iterator[Server]:
    """A server of its own: draining the session's shared one would refuse other tests."""
    handle = start_server(engine_config(tiny_llama), ApiConfig(drain_timeout_s=30))
    yield handle
    handle.stop()


def chat_body(model: str, max_tokens: int, stream: bool = False) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
    }


def test_admin_drain_refuses_new_work_keeps_probes_and_can_be_cancelled(drainable) -> None:
    url, model = drainable.url, drainable.model
    assert httpx.get(url + "/ready").status_code == 200
    began = httpx.post(url + "/admin/drain")
    assert began.status_code == 200 and began.json()["draining"] is True
    try:
        ready = httpx.get(url + "/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        refused = httpx.post(url + "/v1/chat/completions", json=chat_body(model, 2), timeout=30)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "draining"
        assert 1 <= int(refused.headers["retry-after"]) <= 30
        anthropic = {
            "model": model,
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "Hi"}],
        }
        refused = httpx.post(url + "/v1/messages", json=anthropic, timeout=30)
        assert refused.status_code == 503 and "retry-after" in refused.headers
        assert refused.json()["type"] == "error"  # in the route's own protocol's shape
        assert refused.json()["error"]["type"] == "overloaded_error"
        assert httpx.get(url + "/health").status_code == 200  # liveness is not readiness
        assert httpx.get(url + "/metrics").status_code == 200
    finally:
        cancelled = httpx.delete(url + "/admin/drain")
    assert cancelled.status_code == 200 and cancelled.json()["draining"] is False
    assert httpx.get(url + "/ready").status_code == 200
    served = httpx.post(url + "/v1/chat/completions", json=chat_body(model, 2), timeout=30)
    assert served.status_code == 200


def test_a_stream_running_when_the_drain_begins_finishes_whole(drainable) -> None:
    url, model = drainable.url, drainable.model
    body = chat_body(model, 200, stream=True)
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["choices"]
            status = httpx.post(url + "/admin/drain").json()
            assert status["active_requests"] == 1 and status["drained"] is False
            rest = [line[6:] for line in lines if line.startswith("data: ")]
        assert rest[-1] == "[DONE]"
        reasons = [c["finish_reason"] for e in rest[:-1] for c in json.loads(e)["choices"]]
        assert "length" in reasons  # the whole answer came, to its token limit
        after = httpx.get(url + "/admin/drain").json()
        assert after["active_requests"] == 0 and after["drained"] is True
    finally:
        httpx.delete(url + "/admin/drain")


def test_drain_state_deadline_and_retry_after_follow_its_clock() -> None:
    now = [100.0]
    drain = Drain(timeout_s=10, clock=lambda: now[0])
    assert not drain.draining and not drain.done
    drain.active = 2
    drain.begin(exit_when_done=False)
    assert drain.draining and not drain.done and drain.retry_after_s() == 10
    now[0] = 107.5
    assert drain.retry_after_s() == 3 and not drain.done
    now[0] = 110.0
    assert drain.done  # the deadline passed with requests still running
    drain.begin(exit_when_done=True)
    assert not drain.cancel()  # a drain that ends in exit is never undone
    other = Drain(timeout_s=10, clock=lambda: now[0])
    other.begin(exit_when_done=False)
    assert other.done  # nothing running: drained at once


def _serve(model: Path, home: Path, drain_timeout_s: float) -> ServeProcess:
    args = ["--model", str(model), "--max-model-len", "2048", "--no-disk"]
    args += ["--drain-timeout", str(drain_timeout_s), "--log-level", "info"]
    server = ServeProcess(args, home)
    server.wait_healthy(timeout_s=600)
    return server


def _first_chunks(streams: list[Iterator[str]]) -> None:
    for lines in streams:
        next(line for line in lines if line.startswith("data: "))


@pytest.mark.slow
def test_sigterm_drains_running_streams_then_exits_cleanly(
    default_model_path: Path, tmp_path: Path
) -> None:
    server = _serve(default_model_path, tmp_path / "home", drain_timeout_s=120)
    url, model = server.url, default_model_path.name
    body = chat_body(model, 120, stream=True)
    with httpx.Client(timeout=120) as client:
        contexts = [client.stream("POST", url + "/v1/chat/completions", json=body) for _ in "ab"]
        responses = [c.__enter__() for c in contexts]
        streams = [r.iter_lines() for r in responses]
        _first_chunks(streams)
        server.proc.send_signal(15)
        deadline = time.monotonic() + 30
        while httpx.get(url + "/ready").status_code == 200:  # the signal is handled on a tick
            assert time.monotonic() < deadline
        refused = client.post(url + "/v1/chat/completions", json=chat_body(model, 2))
        assert refused.status_code == 503 and "retry-after" in refused.headers
        assert client.get(url + "/health").status_code == 200
        for lines in streams:
            rest = [line[6:] for line in lines if line.startswith("data: ")]
            assert rest[-1] == "[DONE]"
        for c in contexts:
            c.__exit__(None, None, None)
    out = server.output()
    assert server.proc.returncode == 0, out
    assert "SIGTERM: draining" in out and "timed out" not in out


@pytest.mark.slow
def test_sigterm_exits_when_the_drain_timeout_runs_out(
    default_model_path: Path, tmp_path: Path
) -> None:
    server = _serve(default_model_path, tmp_path / "home", drain_timeout_s=1)
    url, model = server.url, default_model_path.name
    body = chat_body(model, 1800, stream=True)  # far longer than the drain allows
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", url + "/v1/chat/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        _first_chunks([lines])
        sent = time.monotonic()
        server.proc.send_signal(15)
        out = server.output()  # waits for the exit
        took = time.monotonic() - sent
    assert server.proc.returncode == 0, out
    assert "drain timed out with 1 requests running" in out
    assert took < 30, took


@pytest.mark.slow
def test_sigterm_finishes_the_pending_writes_to_the_shared_tier(
    tiny_llama: Path, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Every block a write-through server computed is in Redis once SIGTERM's drain has ended:
    the signal lands right after the last answer, while its blocks' writes are still queued."""
    args = ["--model", str(tiny_llama), "--dtype", "float32", "--block-size", "4"]
    args += ["--num-blocks", "256", "--no-disk", "--redis-url", redis_server.url]
    args += ["--write-policy", "write-through", "--log-level", "info"]
    server = ServeProcess(args, tmp_path / "home")
    server.wait_healthy()
    prompts = [fresh_text(200, seed=700 + i) for i in range(6)]
    body = {"model": tiny_llama.name, "max_tokens": 1, "temperature": 0}
    with httpx.Client(timeout=60) as client:
        for prompt in prompts:  # one after another: the last one's writes are the freshest
            r = client.post(f"{server.url}/v1/completions", json={**body, "prompt": prompt})
            assert r.status_code == 200
    server.proc.send_signal(15)
    out = server.output()
    assert server.proc.returncode == 0, out
    keys = redis.Redis.from_url(redis_server.url).keys("radixcache:*")
    assert len(keys) >= len(prompts) * (200 // 4), out  # every prompt's every full block
