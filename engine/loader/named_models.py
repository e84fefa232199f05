"""The models `--model NAME` fetches and converts into the cache folder (instead of a path)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from engine.loader.default_model import DEFAULT_MODEL_NAME, ensure_default_model
from engine.loader.gemma_model import GEMMA_MODEL_NAME, ensure_gemma_model

NAMED_MODELS: dict[str, Callable[[Path | None, bool], Path]] = {
    DEFAULT_MODEL_NAME: ensure_default_model,
    GEMMA_MODEL_NAME: ensure_gemma_model,
}
