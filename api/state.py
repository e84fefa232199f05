"""Per-app server state (engine handle, metrics, counters history, admission control)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from api.config import ApiConfig
from api.engine_stats import EngineCounters
from api.errors import ApiError
from api.metrics import ApiMetrics
from api.stats_history import StatsHistory


@dataclass
class ServerState:
    engine: Any  # engine.async_engine.AsyncEngine
    config: ApiConfig
    metrics: ApiMetrics
    history: StatsHistory
    read_counters: Any  # Callable[[], EngineCounters]
    started_at: float = field(default_factory=time.time)
    in_flight: int = 0
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
        return self.read_counters()

    def flat_counters(self, counters: EngineCounters | None = None) -> dict[str, float]:
        flat = (counters or self.counters()).flat()
        flat["output_tokens"] = float(self.metrics.output_tokens)
        return flat

    def sample(self) -> None:
        """Records the counters (blocking engine call: run it off the event loop)."""
        self.history.record(time.time(), self.flat_counters())

    def tokens_per_s(self, window_s: float = 60.0) -> float:
        """Output tokens/s over the last window (API-side counter, no engine call)."""
        now = time.time()
        current = {"output_tokens": float(self.metrics.output_tokens)}
        diff, span = self.history.delta(now, current, window_s)
        return diff["output_tokens"] / span if span > 0 else 0.0

    @property
    def queue_limit(self) -> int:
        return min(self.config.max_queue, getattr(self.engine, "max_in_flight", 1 << 30))

    def acquire(self, weight: int = 1) -> None:
        """Takes `weight` slots of the bounded queue (release them when done); 429 when full."""
        if self.in_flight + weight > self.queue_limit:
            self.metrics.rejected.inc()
            raise ApiError(
                429,
                f"Server is at capacity: {self.in_flight} requests in flight "
                f"(limit {self.queue_limit}); retry later",
                code="queue_full",
            )
        self.in_flight += weight

    def release(self, weight: int = 1) -> None:
        self.in_flight -= weight


def state_of(request: Request) -> ServerState:
    state = getattr(request.app.state, "server", None)
    if state is None:
        raise ApiError(503, "The engine is not ready yet", code="not_ready")
    return state
