"""Every bad input gets an OpenAI-style 4xx JSON error, never a 500."""

from __future__ import annotations

import httpx
import pytest

from api.config import ApiConfig
from engine.kv.admin import CheckIntegrity
from tests.api.servers import MAX_MODEL_LEN, Server, engine_config, start_server


def post(http: httpx.Client, path: str, body: object) -> httpx.Response:
    return http.post(path, json=body)


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param
    return err


def completion(server: Server, **kw) -> dict:
    return {"model": server.model, "prompt": "hello", "max_tokens": 4, **kw}


def chat(server: Server, **kw) -> dict:
    return {"model": server.model, "messages": [{"role": "user", "content": "hi"}], **kw}


def test_invalid_json(http: httpx.Client) -> None:
    headers = {"content-type": "application/json"}
    for body in (b"{not json", b"", b"[1, 2, 3]", b"\xff\xfe"):
        r = http.post("/v1/completions", content=body, headers=headers)
        assert_error(r, 400)


def test_unknown_model(http, server) -> None:
    err = assert_error(post(http, "/v1/completions", completion(server, model="gpt-9")), 404)
    assert err["code"] == "model_not_found"
    assert_error(post(http, "/v1/chat/completions", chat(server, model="gpt-9")), 404)


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/completions", "prompt"),
        ("/v1/completions", "model"),
        ("/v1/chat/completions", "messages"),
    ],
)
def test_missing_fields(http, server, path, field) -> None:
    body = completion(server) if path == "/v1/completions" else chat(server)
    del body[field]
    err = assert_error(post(http, path, body), 400, field)
    assert "Missing" in err["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", "4"),
        ("temperature", "hot"),
        ("prompt", 12),
        ("prompt", [1.5, 2]),
        ("n", 1.5),
        ("stream", "yes"),
        ("stop", 3),
        ("seed", "x"),
    ],
)
def test_wrong_types(http, server, field, value) -> None:
    assert_error(post(http, "/v1/completions", completion(server, **{field: value})), 400)


def test_wrong_message_shapes(http, server) -> None:
    for messages in ([{"role": "wizard", "content": "x"}], [{"content": "x"}], "hi", [1]):
        assert_error(post(http, "/v1/chat/completions", chat(server, messages=messages)), 400)


def test_empty_prompt(http, server) -> None:
    for prompt in ("", [], [[]]):
        assert_error(post(http, "/v1/completions", completion(server, prompt=prompt)), 400)
    assert_error(post(http, "/v1/chat/completions", chat(server, messages=[])), 400)


def test_token_ids_outside_vocabulary(http, server) -> None:
    r = post(http, "/v1/completions", completion(server, prompt=[1, 2, 10**9]))
    assert_error(r, 400, "prompt")
    r = post(http, "/v1/completions", completion(server, prompt=[-1]))
    assert_error(r, 400, "prompt")


def test_prompt_longer_than_context(http, server) -> None:
    long_prompt = "a" * (MAX_MODEL_LEN + 10)
    err = assert_error(post(http, "/v1/completions", completion(server, prompt=long_prompt)), 400)
    assert err["code"] == "context_length_exceeded"
    long_chat = chat(server, messages=[{"role": "user", "content": long_prompt}])
    assert_error(post(http, "/v1/chat/completions", long_chat), 400)


@pytest.mark.parametrize("max_tokens", [0, -3, MAX_MODEL_LEN, 10**9])
def test_bad_max_tokens(http, server, max_tokens) -> None:
    assert_error(post(http, "/v1/completions", completion(server, max_tokens=max_tokens)), 400)
    body = chat(server, max_tokens=max_tokens)
    assert_error(post(http, "/v1/chat/completions", body), 400)


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", -0.5), ("top_p", 0.0), ("top_p", 1.5), ("top_p", -1), ("n", 0), ("n", 1000)],
)
def test_out_of_range_sampling(http, server, field, value) -> None:
    r = post(http, "/v1/chat/completions", chat(server, **{field: value}))
    assert_error(r, 400, field)


def test_empty_stop_string_is_a_400(http, server) -> None:
    assert_error(post(http, "/v1/completions", completion(server, stop="")), 400)


def test_streaming_request_errors_before_stream_starts(http, server) -> None:
    r = post(http, "/v1/completions", completion(server, stream=True, temperature=-1))
    assert_error(r, 400, "temperature")


def test_oversized_body_rejected(http, server) -> None:
    limit = server.state.config.max_body_bytes
    body = completion(server, prompt="x" * (limit + 1))
    assert_error(post(http, "/v1/completions", body), 413)

    def chunks():
        yield b'{"model": "m", "prompt": "'
        for _ in range(limit // 65536 + 2):
            yield b"x" * 65536
        yield b'"}'

    r = http.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert_error(r, 413)


def test_unknown_route_and_method(http) -> None:
    assert_error(http.get("/v1/nothing"), 404)
    assert_error(http.get("/v1/completions"), 405)


def test_bad_query_parameters(http) -> None:
    assert_error(http.get("/v1/cache/stats", params={"window_minutes": -1}), 400)
    assert_error(http.get("/v1/cache/prefixes", params={"limit": "many"}), 400)


@pytest.fixture(scope="module")
def small_pool_server(tiny_llama):
    # 8 blocks of 16 tokens = 128 tokens of KV, under the 512-token context window
    handle = start_server(engine_config(tiny_llama, num_blocks=8), ApiConfig())
    yield handle
    handle.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_request_larger_than_kv_pool_is_400_before_streaming(small_pool_server, stream) -> None:
    server = small_pool_server
    with httpx.Client(base_url=server.url, timeout=60) as http:
        body = completion(server, prompt="a" * 100, max_tokens=100, stream=stream)
        err = assert_error(post(http, "/v1/completions", body), 400, "max_tokens")
        assert err["code"] == "kv_capacity_exceeded"
        chat_body = chat(server, max_tokens=200, stream=stream)
        assert_error(post(http, "/v1/chat/completions", chat_body), 400, "max_tokens")
        ok = post(http, "/v1/completions", completion(server, prompt="a" * 20, max_tokens=8))
        assert ok.status_code == 200, ok.text
    server.engine.admin(CheckIntegrity())
