"""Model execution and scheduling. Public names are imported lazily (no import-time work)."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AsyncEngine": "engine.async_engine",
    "EngineOverloaded": "engine.async_engine",
    "EngineConfig": "engine.config",
    "LLM": "engine.llm",
    "LLMEngine": "engine.llm_engine",
    "CompletionDelta": "engine.outputs",
    "Prompt": "engine.request",
    "RequestResult": "engine.outputs",
    "RequestOutput": "engine.outputs",
    "RequestTooLarge": "engine.request",
    "SamplingParams": "engine.sampling_params",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
