"""Speculative decoding settings."""

from __future__ import annotations

from dataclasses import dataclass

# off: no drafts; ngram: the request's own prompt and output (prompt lookup); cache: the radix
# tree's continuation first, then prompt lookup, then the namespace's suffix index
SPECULATIVE_MODES = ("off", "ngram", "cache")
DEFAULT_MODE = "cache"
DEFAULT_NUM_TOKENS = 8
DEFAULT_INDEX_TOKENS = 1 << 18  # the suffix index's bound (all namespaces)
# what a draft row is weighed against: fitted: the decode steps' measured cost line (drafts go
# where they pay on this machine now); prior: a fixed row share of a step, so the same requests
# draft the same way on any machine, however loaded (tests, reproducible runs)
STEP_COST_MODELS = ("fitted", "prior")
DEFAULT_STEP_COST = "fitted"


@dataclass(frozen=True)
class SpecConfig:
    mode: str = DEFAULT_MODE
    num_tokens: int = DEFAULT_NUM_TOKENS  # the most draft tokens of one sequence in one step
    # prompt lookup and suffix index keys, longest first (a 2-token match misses too often in
    # free text to pay for its verify rows)
    ngram_sizes: tuple[int, ...] = (4, 3)
    suffix_index_tokens: int = DEFAULT_INDEX_TOKENS
    step_cost: str = DEFAULT_STEP_COST

    def __post_init__(self) -> None:
        if self.mode not in SPECULATIVE_MODES:
            raise ValueError(f"speculative must be one of {SPECULATIVE_MODES}, got {self.mode!r}")
        if self.num_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        if self.suffix_index_tokens < 1:
            raise ValueError("speculative_index_tokens must be >= 1")
        if self.step_cost not in STEP_COST_MODELS:
            raise ValueError(
                f"speculative_step_cost must be one of {STEP_COST_MODELS}, got {self.step_cost!r}"
            )

    @property
    def enabled(self) -> bool:
        return self.mode != "off"
