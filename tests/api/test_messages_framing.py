"""/v1/messages stream framing, property-based: whatever a streaming request asks for (valid or
not), the answer is an Anthropic error (4xx, JSON) before the stream starts, or `event: <type>` +
`data: <json>` frames whose type matches the data's, in Anthropic's order (message_start, ping,
blocks each started, delta'd and stopped at their index, message_delta, message_stop), or ending
with one `event: error`."""

from __future__ import annotations

import json

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.servers import Server

texts = st.text(alphabet="abcdefgh XYZ\\n", min_size=0, max_size=30)
block = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "text", "text", "image"]), "text": texts},
    optional={"cache_control": st.sampled_from([{"type": "ephemeral"}] * 3 + [{"type": "x"}])},
)
bodies = st.fixed_dictionaries(
    {
        "max_tokens": st.sampled_from([1, 2, 4, 6, 0, "4"]),
        "messages": st.lists(
            st.fixed_dictionaries(
                {
                    "role": st.sampled_from(["user", "user", "assistant", "system"]),
                    "content": st.one_of(texts, st.lists(block, max_size=3)),
                }
            ),
            max_size=3,
        ),
    },
    optional={
        "system": st.one_of(texts, st.lists(block, max_size=3)),
        "temperature": st.sampled_from([0, 0.7, 0.7, 3.0]),
        "top_k": st.integers(-1, 5),
        "stop_sequences": st.lists(texts, max_size=3),
        "cache_control": st.just({"type": "ephemeral", "ttl": "1h"}),
    },
)
STREAMED: list[str] = []  # the last event of each stream that ran


def frames(raw: str) -> list[tuple[str, dict]]:
    assert raw.endswith("\n\n"), raw[-80:]
    out = []
    for frame in raw[:-2].split("\n\n"):
        kind, data = frame.split("\n")
        assert kind.startswith("event: ") and data.startswith("data: "), frame
        payload = json.loads(data[len("data: ") :])
        assert payload["type"] == kind[len("event: ") :], frame
        out.append((payload["type"], payload))
    return out


def check_order(events: list[tuple[str, dict]]) -> None:
    kinds = [k for k, _ in events]
    if kinds[-1] == "error":
        assert "error" not in kinds[:-1]
        kinds = kinds[:-1]
        events = events[:-1]
    else:
        assert kinds[-2:] == ["message_delta", "message_stop"], kinds
        kinds, events = kinds[:-2], events[:-2]
    if not kinds:
        return
    assert kinds[:2] == ["message_start", "ping"], kinds
    open_index = None
    next_index = 0
    for kind, payload in events[2:]:
        if kind == "content_block_start":
            assert open_index is None and payload["index"] == next_index
            open_index, next_index = next_index, next_index + 1
        elif kind == "content_block_delta":
            assert payload["index"] == open_index
        else:
            assert kind == "content_block_stop" and payload["index"] == open_index, kind
            open_index = None


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)
@given(body=bodies)
def test_every_stream_is_framed_in_order(server: Server, body: dict) -> None:
    body = body | {"model": server.model, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    if r.status_code != 200:
        assert 400 <= r.status_code < 500, r.text
        error = r.json()
        assert error["type"] == "error" and error["error"]["message"], r.text
        return
    events = frames(r.text)
    check_order(events)
    STREAMED.append(events[-1][0])


def test_some_streams_ran() -> None:
    """The strategy reaches generation, not only refusals (runs after the property test)."""
    assert len(STREAMED) >= 5, STREAMED
