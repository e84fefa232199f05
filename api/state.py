"""Per-app server state: the engine handle, metrics and the history of the cache counters."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from api.config import ApiConfig
from api.engine_stats import CacheCounters, EngineCounters, read_counters
from api.errors import ApiError
from api.metrics import ApiMetrics
from api.stats_history import StatsHistory

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine


@dataclass
class ServerState:
    engine: AsyncEngine
    config: ApiConfig
    metrics: ApiMetrics
    history: StatsHistory[CacheCounters]
    started_at: float = field(default_factory=time.time)
    flops_per_token: float = 0.0  # ~2 x parameters: compute a cached prompt token saves

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
        self.history.record(time.time(), self.counters().cache)

    def tokens_per_s(self, window_s: float = 60.0) -> float:
        """Output tokens/s over the last window (API-side counter, no engine call)."""
        current = CacheCounters(output_tokens=self.metrics.output_tokens)
        diff, span = self.history.delta(time.time(), current, window_s)
        return diff.output_tokens / span if span > 0 else 0.0


def state_of(request: Request) -> ServerState:
    state = getattr(request.app.state, "server", None)
    if state is None:
        raise ApiError(503, "The engine is not ready yet", code="not_ready")
    return state
