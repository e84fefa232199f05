"""Server-side settings of the HTTP layer (the engine has its own EngineConfig)."""

from __future__ import annotations

import hashlib
import ipaddress
import socket
from dataclasses import dataclass, field
from pathlib import Path

RESPONSES_TTL_S = 30 * 24 * 3600.0  # OpenAI keeps a stored response 30 days
METRIC_NAMES = ("radixcache", "vllm")  # /metrics names: ours, or vLLM's for what it also reports


def tenant_of_key(key: str) -> str:
    """A stable tenant name for an API key that was given without one."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def parse_api_keys(specs: list[str]) -> dict[str, str]:
    """`KEY` or `TENANT=KEY` (keys sharing a tenant share its cache) -> {key: tenant}."""
    keys: dict[str, str] = {}
    for spec in specs:
        tenant, sep, key = spec.partition("=")
        if not sep:
            tenant, key = tenant_of_key(spec), spec
        if not key or not tenant:
            raise ValueError(f"bad --api-key {spec!r}: expected KEY or TENANT=KEY")
        keys[key] = tenant
    return keys


@dataclass(frozen=True)
class ApiConfig:
    api_keys: dict[str, str] = field(default_factory=dict)  # key -> tenant
    admin_key: str | None = None
    served_model_name: str | None = None  # default: the engine's model name
    max_queue: int = 256  # requests in flight (running + waiting); beyond: 429
    max_body_bytes: int = 4 * 1024 * 1024
    stats_interval_s: float = 5.0  # how often cache counters are sampled for windowed rates
    stats_history_s: float = 3600.0
    metrics_names: str = METRIC_NAMES[0]  # one of METRIC_NAMES
    tracked_prompt_cache_keys: int = 64  # keys counted apart in /v1/cache/stats (LRU beyond)
    tool_call_parser: str | None = None  # tool-call format; None: the chat template's (hermes)
    # with no key configured, a caller is admin only while this holds: the server is bound to
    # loopback, or --open-admin said so (on a network address anyone could read every prompt)
    open_admin: bool = True
    # /v1/responses' store (store=true, previous_response_id): SQLite at this path (None: in
    # memory); bounded by count, each record kept ttl seconds
    responses_store_path: Path | None = None
    responses_ttl_s: float = RESPONSES_TTL_S
    responses_max: int = 100_000

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys) or self.admin_key is not None


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one (127.0.0.0/8, ::1): 0.0.0.0, ::, a
    LAN address or a name that resolves to one are reachable from the network."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)
