"""SSE framing, property-based: whatever a streaming request asks for (valid or not), the answer is
either a JSON 4xx before the stream starts, or `data: <json>` events separated by blank lines that end
with exactly one `data: [DONE]`, an error event (if any) right before it."""

from __future__ import annotations

import json

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.servers import Server

texts = st.text(alphabet="abcdefgh XYZ\n", min_size=0, max_size=40)
bodies = st.fixed_dictionaries(
    {
        "prompt": st.one_of(texts, st.lists(st.integers(-5, 400), max_size=12)),
        "max_tokens": st.one_of(st.none(), st.integers(-1, 6)),
        "n": st.integers(0, 3),
        "temperature": st.sampled_from([0, 0.7, 3.0]),
        "stop": st.one_of(st.none(), texts, st.lists(texts, max_size=3)),
        "logprobs": st.one_of(st.none(), st.integers(-1, 3)),
        "echo": st.booleans(),
        "stream_options": st.sampled_from([None, {"include_usage": True}]),
    }
)


def frames(raw: str) -> list[str]:
    assert raw.endswith("\n\n"), raw[-80:]
    events = raw[:-2].split("\n\n")
    for event in events:
        assert event.startswith("data: ") and "\n" not in event, event
    return [e[len("data: ") :] for e in events]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies, chat=st.booleans())
def test_every_stream_is_framed_and_ends_once(server: Server, body: dict, chat: bool) -> None:
    body = {k: v for k, v in body.items() if v is not None} | {"model": server.model}
    body["stream"] = True
    path = "/v1/completions"
    if chat:
        path = "/v1/chat/completions"
        prompt = body.pop("prompt")
        body.pop("echo")
        body["messages"] = [{"role": "user", "content": prompt}]
        body["logprobs"] = body.get("logprobs", 0) > 0
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post(path, json=body)
    if r.status_code != 200:
        assert 400 <= r.status_code < 500 and r.json()["error"]["message"], r.text
        return
    data = frames(r.text)
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    events = [json.loads(d) for d in data[:-1]]
    errors = [i for i, e in enumerate(events) if "error" in e]
    assert errors in ([], [len(events) - 1]), events
