"""Fixtures of the API tests: real servers on free ports (helpers in tests/api/servers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.config import ApiConfig
from engine.llm import LLM
from tests.api.servers import (
    ADMIN_KEY,
    API_KEYS,
    ENGINE_SETTINGS,
    Server,
    engine_config,
    start_server,
)


@pytest.fixture(scope="session")
def server(tiny_llama: Path) -> Iterator[Server]:
    handle = start_server(engine_config(tiny_llama), ApiConfig(max_queue=64))
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def auth_server(tiny_llama: Path) -> Iterator[Server]:
    cfg = ApiConfig(api_keys=dict(API_KEYS), admin_key=ADMIN_KEY)
    handle = start_server(engine_config(tiny_llama), cfg)
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def long_server(tiny_llama: Path) -> Iterator[Server]:
    """The tiny model with its whole 1024-token window: room for the tools block that the
    hermes template renders (about 450 byte tokens) and a few turns."""
    handle = start_server(engine_config(tiny_llama, max_model_len=1024), ApiConfig(max_queue=64))
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def default_server(default_model_path: Path) -> Iterator[Server]:
    """The built-in default model (its ChatML template matters: tools, structured outputs), in
    deterministic mode so a streamed answer and a whole one are the same tokens."""
    cfg = engine_config(default_model_path, max_model_len=2048, deterministic=True)
    handle = start_server(cfg, ApiConfig(max_queue=64), healthy_timeout_s=600)  # probes: slow
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def offline(tiny_llama: Path) -> LLM:
    """The offline LLM API on the same model and settings: the reference for server outputs."""
    return LLM(str(tiny_llama), **ENGINE_SETTINGS)


@pytest.fixture()
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        yield client


@pytest.fixture(scope="module")
def keyed_replicas(tiny_llama: Path) -> Iterator[list[Server]]:
    """Two replicas for a router to front, each with a response store of its own and the
    callers' keys (API_KEYS)."""
    servers = [
        start_server(engine_config(tiny_llama), ApiConfig(api_keys=dict(API_KEYS)))
        for _ in range(2)
    ]
    yield servers
    for s in servers:
        s.stop()
