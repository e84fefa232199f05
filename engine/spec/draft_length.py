"""How many draft tokens a sequence gets next, from how its drafts fared.

A fully accepted draft lets the next one grow; a partly accepted one sets the next to one past
what was accepted. A draft with nothing accepted costs a verify step for one token, so each one
in a row doubles the number of steps the sequence then runs without drafting (up to
MAX_PAUSE): on text where drafts do not pay, speculation falls to (almost) nothing."""

from __future__ import annotations

from dataclasses import dataclass

MAX_PAUSE = 64


@dataclass
class DraftLength:
    max_tokens: int
    current: int = 0  # 0 = not started: max_tokens
    misses: int = 0  # drafts in a row with nothing accepted
    pause: int = 0  # steps left without drafting

    def next(self) -> int:
        """The draft length for this step (0 while paused)."""
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.current or self.max_tokens

    def record(self, drafted: int, accepted: int) -> None:
        if accepted == 0:
            self.misses += 1
            self.pause = min(MAX_PAUSE, 1 << self.misses)
            self.current = 1
            return
        self.misses = 0
        if accepted == drafted:
            self.current = min(self.max_tokens, 2 * drafted)
        else:
            self.current = accepted + 1
