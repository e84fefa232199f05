"""How many draft tokens a sequence gets next: as many as are expected to pay for their rows.

Draft token j pays when the chance that it and the tokens before it are accepted, times what a
token costs by plain decoding (the step's time over the sequences it decodes), exceeds what one
more row adds to the step (engine/speculative/step_cost.py). So where steps are dear per token (a small
batch, the last sequences of a wave) drafts are long, and where rows are dear (a full batch)
only sources that are usually right draft at all.

The chance is a chain: the sequence's own recent rate of a source's first token (kept up to date
while it does not draft: the token the source would have drafted is checked against the one
sampled, so a source that starts to fit the text is noticed), then the source's engine-wide rate
of each next token, given that the ones before it held. Of the sources that have a draft, the one
with the largest expected net gain drafts; the others' first tokens are scored as if they had."""

from __future__ import annotations

from dataclasses import dataclass, field

FIRST_RATE_WEIGHT = 0.25  # how much one observation moves a sequence's first-token rate


@dataclass
class SourceRates:
    """One source's engine-wide counts: reached[j] drafts got to token j with all before it
    held, held[j] of them held token j too (one pseudo-count each way: 1/2 before any)."""

    reached: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)

    def rate(self, j: int) -> float:
        if j >= len(self.reached):
            return 0.5
        return (self.held[j] + 1) / (self.reached[j] + 2)

    def record(self, drafted: int, accepted: int) -> None:
        grow = drafted - len(self.reached)
        if grow > 0:
            self.reached += [0] * grow
            self.held += [0] * grow
        for j in range(min(drafted, accepted + 1)):
            self.reached[j] += 1
        for j in range(accepted):
            self.held[j] += 1


@dataclass
class FirstTokenRates:
    """A sequence's recent rate of each source's first draft token being right."""

    rates: dict[str, float] = field(default_factory=dict)

    def get(self, source: str, engine_wide: SourceRates) -> float:
        return self.rates.get(source, engine_wide.rate(0))

    def observe(self, source: str, engine_wide: SourceRates, hit: bool) -> None:
        rate = self.get(source, engine_wide)
        self.rates[source] = rate + FIRST_RATE_WEIGHT * (float(hit) - rate)


def draft_plan(
    first: float, later: SourceRates, threshold: float, max_tokens: int
) -> tuple[int, float]:
    """(k, gain): k, the most tokens whose every one is accepted with a chance above `threshold`
    (a row's cost over a token's worth), the first with chance `first`, each next one with
    later's rate; gain, the accepted tokens expected less what the k rows cost in tokens' worth,
    so the sources of one sequence can be compared."""
    chance, k, gain = first, 0, 0.0
    while k < max_tokens and chance > threshold:
        k += 1
        gain += chance - threshold
        chance *= later.rate(k)
    return k, gain
