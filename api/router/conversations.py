"""Stored response id -> the replica that answered it (bounded, least recently used first out),
learned from the answers that pass through the router: a whole Response's top-level `id`, a
stream's first event (`response.created`, whose `response.id` it is).

A replica keeps its stored responses in its own store unless the replicas share one in Redis
(the router's --shared-response-store): then the map only says where a conversation's prefix is
cached, otherwise it is the one replica that can continue the conversation, GET or DELETE it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from api.router.homes import DEFAULT_MAX_HOMES, ReplicaHomes

SCAN_LIMIT = 64 * 1024  # bytes of a stream read for its first event before giving up
DEFAULT_MAX_IDS = DEFAULT_MAX_HOMES

ResponseHomes = ReplicaHomes[str]


def response_homes(max_ids: int = DEFAULT_MAX_IDS) -> ResponseHomes:
    return ReplicaHomes(max_ids, "ids")


def response_id_of_body(body: bytes) -> str | None:
    """The `id` of a whole Response object (None for anything else)."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    rid = data.get("id") if isinstance(data, dict) else None
    return rid if isinstance(rid, str) and data.get("object") == "response" else None


@dataclass
class StreamIdScanner:
    """Reads a Responses stream's chunks until its first event is whole, then knows the id."""

    buffer: bytearray = field(default_factory=bytearray)
    done: bool = False
    response_id: str | None = None

    def feed(self, chunk: bytes) -> str | None:
        """The response id once the first event has been read (None before, or if it had none)."""
        if self.done:
            return None
        self.buffer += chunk
        text = bytes(self.buffer).replace(b"\r\n", b"\n")
        event, sep, _ = text.partition(b"\n\n")
        if not sep:
            if len(self.buffer) > SCAN_LIMIT:
                self.done = True
            return None
        self.done = True
        self.buffer.clear()
        self.response_id = _created_id(event)
        return self.response_id


def _created_id(event: bytes) -> str | None:
    data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
    try:
        payload = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    response = payload.get("response") if isinstance(payload, dict) else None
    rid = response.get("id") if isinstance(response, dict) else None
    return rid if isinstance(rid, str) else None
