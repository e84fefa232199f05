"""Per-app server state: the engine handle, metrics, the history of the sampled counters, the
counts per prompt_cache_key and the Responses store."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from api.chat_template import ChatTemplates
from api.config import ApiConfig
from api.errors import ApiError
from api.observability.engine_stats import CacheCounters, EngineCounters, read_counters
from api.observability.metrics import ApiMetrics
from api.observability.prompt_cache_keys import PromptCacheKeys
from api.observability.server_counters import ServerCounters, server_counters
from api.observability.stats_history import StatsHistory

if TYPE_CHECKING:
    from api.openai.responses.store import ResponseStore
    from engine.async_engine import AsyncEngine


@dataclass
class ServerState:
    engine: AsyncEngine
    config: ApiConfig
    metrics: ApiMetrics
    history: StatsHistory[ServerCounters]
    started_at: float = field(default_factory=time.time)
    flops_per_token: float = 0.0  # ~2 x parameters: compute a cached prompt token saves
    templates: ChatTemplates = field(default_factory=lambda: ChatTemplates(None))
    prompt_cache_keys: PromptCacheKeys = field(default_factory=PromptCacheKeys)
    responses: ResponseStore | None = None  # /v1/responses' stored conversations

    @property
    def model_name(self) -> str:
        return self.config.served_model_name or self.engine.model_name

    @property
    def served_names(self) -> list[str]:
        names = [self.model_name]
        if self.engine.model_name not in names:
            names.append(self.engine.model_name)
        return names

    def counters(self) -> EngineCounters:
        """One snapshot of the engine's counters (blocking engine call: run it off the loop)."""
        return read_counters(self.engine.snapshot(), self.metrics.output_tokens)

    def sample(self) -> None:
        """Records the counters (blocking engine call: run it off the event loop)."""
        ttft = self.metrics.ttft_recorder.snapshot()
        self.history.record(time.time(), server_counters(self.counters(), ttft))

    def cache_delta(self, current: CacheCounters, window_s: float) -> tuple[CacheCounters, float]:
        """Cache counter increases over the last window -> (increases, covered seconds)."""
        now = time.time()
        base = self.history.base(now, window_s)
        if base is None:
            return current.minus(current), 0.0
        return current.minus(base.counters.cache), max(now - base.time, 0.0)

    def tokens_per_s(self, window_s: float = 60.0) -> float:
        """Output tokens/s over the last window (API-side counter, no engine call)."""
        now = time.time()
        base = self.history.base(now, window_s)
        if base is None or now <= base.time:
            return 0.0
        return (self.metrics.output_tokens - base.counters.cache.output_tokens) / (now - base.time)


def state_of(request: Request) -> ServerState:
    state = getattr(request.app.state, "server", None)
    if state is None:
        raise ApiError(503, "The engine is not ready yet", code="not_ready")
    return state
