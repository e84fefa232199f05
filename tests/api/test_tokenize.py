"""/tokenize and /detokenize with vLLM's request and response fields, on the real server."""

from __future__ import annotations

import httpx
import pytest

from tests.api.servers import Server


def test_tokenize_prompt_matches_the_engine_tokenizer(http, server: Server) -> None:
    tok = server.engine.tokenizer
    text = "Hello, tokenizer!"
    r = http.post("/tokenize", json={"model": server.model, "prompt": text})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tok.encode(text) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == server.engine.max_model_len
    assert body["token_strs"] is None
    strs = http.post("/tokenize", json={"prompt": text, "return_token_strs": True}).json()
    assert strs["token_strs"] == [tok.backend.id_to_token(i) for i in body["tokens"]]
    plain = http.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert plain["tokens"] == tok.encode(text, add_special_tokens=False)


def test_tokenize_chat_applies_the_template(http, server: Server) -> None:
    tok = server.engine.tokenizer
    messages = [{"role": "user", "content": "What is a radix tree?"}]
    body = http.post("/tokenize", json={"messages": messages}).json()
    assert body["tokens"] == tok.apply_chat_template(messages, add_generation_prompt=True)
    bare = http.post("/tokenize", json={"messages": messages, "add_generation_prompt": False})
    assert bare.json()["tokens"] == tok.apply_chat_template(messages, add_generation_prompt=False)
    assert bare.json()["count"] < body["count"]
    prefill = messages + [{"role": "assistant", "content": "A tree whose"}]
    cont = http.post(
        "/tokenize",
        json={"messages": prefill, "add_generation_prompt": False, "continue_final_message": True},
    ).json()
    text = http.post("/detokenize", json={"tokens": cont["tokens"]}).json()["prompt"]
    assert text.endswith("A tree whose")


def test_detokenize_round_trips(http) -> None:
    text = "round trip of a prompt"
    ids = http.post("/tokenize", json={"prompt": text}).json()["tokens"]
    r = http.post("/detokenize", json={"tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": text}
    assert http.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/detokenize", {"tokens": [-1]}, 400),
        ("/detokenize", {"tokens": [10**9]}, 400),
        ("/detokenize", {"tokens": ["a"]}, 400),
        ("/detokenize", {}, 400),
        ("/detokenize", {"tokens": [1], "model": "nope"}, 404),
        ("/tokenize", {}, 400),
        ("/tokenize", {"prompt": 5}, 400),
        ("/tokenize", {"prompt": "x", "model": "nope"}, 404),
        ("/tokenize", {"messages": []}, 400),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{x}}"},
            400,
        ),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True},
            400,
        ),
    ],
)
def test_bad_input_is_a_clear_4xx(http, path, body, status) -> None:
    r = http.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]
    assert http.post(path, content=b"{not json").status_code == 400


def test_tokenize_needs_an_api_key_when_keys_are_on(auth_server: Server) -> None:
    with httpx.Client(base_url=auth_server.url, timeout=30.0) as client:
        assert client.post("/tokenize", json={"prompt": "x"}).status_code == 401
        ok = client.post(
            "/tokenize", json={"prompt": "x"}, headers={"Authorization": "Bearer sk-bob"}
        )
        assert ok.status_code == 200 and ok.json()["count"] == 1
