"""Per-step and cumulative engine counters (plain fields; exported at the edge)."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from engine.speculative.stats import SpecStats

if TYPE_CHECKING:
    from radixcache.stats import CacheStats
    from storage.store_stats import StoreSnapshot


@dataclass
class StepStats:
    batch_size: int = 0
    num_prefill_tokens: int = 0  # prompt (or recompute) tokens computed this step
    num_decode_tokens: int = 0
    num_cached_tokens: int = 0  # prefix tokens reused by sequences admitted this step
    num_preempted: int = 0
    step_time: float = 0.0  # seconds, whole step
    forward_time: float = 0.0  # seconds inside the model
    sample_time: float = 0.0  # seconds in the sampler
    num_draft_tokens: int = 0  # speculative draft tokens verified this step

    @property
    def python_overhead(self) -> float:
        return max(0.0, self.step_time - self.forward_time - self.sample_time)

    @property
    def decode_only(self) -> bool:
        return bool(self.num_decode_tokens) and not self.num_prefill_tokens


@dataclass
class EngineStats:
    num_steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    cached_tokens: int = 0
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    step_time: float = 0.0
    forward_time: float = 0.0
    sample_time: float = 0.0
    requests_finished: int = 0
    requests_aborted: int = 0
    requests_rejected: int = 0
    steps_run_ahead: int = 0  # steps launched before the previous step's tokens were read
    spec: SpecStats = field(default_factory=SpecStats)  # speculative decoding
    recent: deque[StepStats] = field(default_factory=lambda: deque(maxlen=256))

    def record(self, step: StepStats) -> None:
        self.num_steps += 1
        self.prefill_tokens += step.num_prefill_tokens
        self.decode_tokens += step.num_decode_tokens
        self.cached_tokens += step.num_cached_tokens
        self.preemptions += step.num_preempted
        self.step_time += step.step_time
        self.forward_time += step.forward_time
        self.sample_time += step.sample_time
        if step.decode_only:
            if step.num_draft_tokens:
                self.spec.num_verify_steps += 1
                self.spec.verify_step_time += step.step_time
            else:
                self.spec.num_plain_decode_steps += 1
                self.spec.plain_decode_step_time += step.step_time
        self.recent.append(step)

    def add_cached(self, by_tier: dict[str, int]) -> None:
        for tier, n in by_tier.items():
            self.cached_tokens_by_tier[tier] = self.cached_tokens_by_tier.get(tier, 0) + n

    @property
    def python_overhead(self) -> float:
        return max(0.0, self.step_time - self.forward_time - self.sample_time)

    def copy(self) -> EngineStats:
        return EngineStats(
            **{
                k: v
                for k, v in vars(self).items()
                if k not in ("recent", "cached_tokens_by_tier", "spec")
            },
            cached_tokens_by_tier=dict(self.cached_tokens_by_tier),
            spec=self.spec.copy(),
            recent=deque(self.recent, maxlen=self.recent.maxlen),
        )

    def snapshot(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k not in ("recent", "spec")}
        out["spec"] = self.spec.snapshot()
        out["python_overhead"] = self.python_overhead
        out["python_overhead_per_step"] = self.python_overhead / max(1, self.num_steps)
        out["last_step"] = asdict(self.recent[-1]) if self.recent else None
        return out


@dataclass(frozen=True)
class EngineSnapshot:
    """Everything the engine reports at one moment (the API renders it; nothing reaches in)."""

    totals: EngineStats  # a copy
    running: int
    waiting: int
    cache: CacheStats
    tiers: StoreSnapshot | None
