"""How many draft tokens a sequence gets next, from how its drafts fared.

A draft from an unproven source starts short (FIRST_DRAFT tokens): on free text most drafts
miss, and a missed token still costs a row of the verify step. A fully accepted draft doubles
the next one (up to the bound); a partly accepted one sets the next to one past what was
accepted. A draft with nothing accepted pauses drafting for a number of steps that doubles with
each such draft in a row (up to MAX_PAUSE): where drafts do not pay, speculation falls to
(almost) nothing. The tree's continuation is the cached text itself: it starts at the bound."""

from __future__ import annotations

from dataclasses import dataclass

FIRST_DRAFT = 2
MAX_PAUSE = 64


@dataclass
class DraftLength:
    max_tokens: int
    current: int = 0  # 0 = nothing verified yet: FIRST_DRAFT
    misses: int = 0  # drafts in a row with nothing accepted
    pause: int = 0  # steps left without drafting

    def next(self) -> int:
        """The draft length for this step (0 while paused)."""
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.current or min(FIRST_DRAFT, self.max_tokens)

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
