"""Fixtures every test package shares: the tiny model folders, the default model, a real
redis-server on a free loopback port, and an engine factory that closes what it built."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.llm import LLM
from tests.redis_server import RedisServer
from tests.tiny_models import make_tiny_model

# what the engine tests run with unless a test says otherwise: exact (float32), small, and
# drafting the same way however loaded the machine is (a prior step cost, not a measured one)
TINY_ENGINE: dict[str, Any] = {
    "dtype": "float32",
    "block_size": 4,
    "seed": 0,
    "speculative_step_cost": "prior",
}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_models")
    return {arch: make_tiny_model(root / arch, arch) for arch in ("llama", "qwen2", "qwen3")}


@pytest.fixture(scope="session")
def windowed_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny Mistral (every layer windowed) and Qwen2 (layer 1 windowed): tests.tiny_models."""
    root = tmp_path_factory.mktemp("windowed_models")
    return {arch: make_tiny_model(root / arch, arch) for arch in ("mistral-swa", "qwen2-swa")}


@pytest.fixture(scope="session")
def tiny_llama(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["llama"]


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    from engine.loader import ensure_default_model

    return ensure_default_model(progress=False)


@pytest.fixture(scope="session")
def gemma_model_path() -> Path:
    from engine.loader.gemma_model import ensure_gemma_model

    return ensure_gemma_model(progress=False)


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_llm(tiny_llama: Path) -> Iterator[Callable[..., LLM]]:
    """make_llm(**settings): an offline LLM on the tiny llama (TINY_ENGINE plus `settings`);
    every engine it built is closed (tier threads stopped) when the test ends."""
    built: list[LLM] = []

    def make(model: Path | None = None, **settings: Any) -> LLM:
        llm = LLM(str(model or tiny_llama), **{**TINY_ENGINE, **settings})
        built.append(llm)
        return llm

    yield make
    for llm in built:
        llm.engine.close()
