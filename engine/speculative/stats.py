"""Speculative decoding counters (plain fields; the API exports them)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    num_drafts: int = 0  # verify rows: sequences that ran a draft in a step
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [j]: drafts whose token j held
    drafted_per_pos: list[int] = field(default_factory=list)  # [j]: drafts that had a token j
    num_verify_steps: int = 0  # decode-only steps (no prefill chunk) with at least one draft
    verify_step_time: float = 0.0
    num_plain_decode_steps: int = 0  # decode-only steps without drafts
    plain_decode_step_time: float = 0.0

    def record_draft(self, drafted: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        grow = drafted - len(self.drafted_per_pos)
        if grow > 0:
            self.drafted_per_pos += [0] * grow
            self.accepted_per_pos += [0] * grow
        for j in range(drafted):
            self.drafted_per_pos[j] += 1
        for j in range(accepted):
            self.accepted_per_pos[j] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verify row: the accepted drafts plus the one the model adds."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def acceptance_per_pos(self) -> list[float]:
        return [
            a / d if d else 0.0
            for a, d in zip(self.accepted_per_pos, self.drafted_per_pos, strict=True)
        ]

    def copy(self) -> SpecStats:
        return SpecStats(
            **{k: v for k, v in vars(self).items() if not k.endswith("_per_pos")},
            accepted_per_pos=list(self.accepted_per_pos),
            drafted_per_pos=list(self.drafted_per_pos),
        )

    def snapshot(self) -> dict:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "accepted_per_pos": list(self.accepted_per_pos),
            "acceptance_per_pos": self.acceptance_per_pos,
            "num_verify_steps": self.num_verify_steps,
            "verify_step_time": self.verify_step_time,
            "num_plain_decode_steps": self.num_plain_decode_steps,
            "plain_decode_step_time": self.plain_decode_step_time,
        }
