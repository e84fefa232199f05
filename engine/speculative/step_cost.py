"""What a decode step costs: seconds = fixed + per_row * rows, fitted online.

Least squares over recent decode-only steps, each older step weighing `decay` less, so the line
follows the machine (another process on the cores, a longer context). A step far slower than the
line predicts (a GC pause, a noisy neighbour) counts as at most `clip` times the prediction."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class StepCost:
    decay: float = 0.98
    clip: float = 3.0
    prior_row_share: float = 1 / 32  # before rows vary: a row costs this share of a step
    min_weight: float = 8.0  # steps (decayed) before the fit is trusted
    _w: float = 0.0
    _x: float = 0.0
    _y: float = 0.0
    _xx: float = 0.0
    _xy: float = 0.0

    @classmethod
    def prior(cls) -> StepCost:
        """A line whose row share never leaves the prior: the fit is never trusted, and what
        `line()` returns then scales with the mean step time, so the threshold a draft row must
        beat (a row's cost over a token's worth) does not depend on the machine's speed."""
        return cls(min_weight=math.inf)

    def record(self, rows: int, seconds: float) -> None:
        if self._w >= self.min_weight:
            seconds = min(seconds, self.clip * self.seconds(rows))
        d = self.decay
        self._w = d * self._w + 1
        self._x = d * self._x + rows
        self._y = d * self._y + seconds
        self._xx = d * self._xx + rows * rows
        self._xy = d * self._xy + rows * seconds

    def line(self) -> tuple[float, float]:
        """(fixed, per_row) seconds; before any step, a unit step and the prior share."""
        if self._w == 0:
            return 1.0, self.prior_row_share
        mx, my = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mx * mx
        if self._w < self.min_weight or var < 0.25:  # rows have not varied: the prior share
            per_row = self.prior_row_share * my / (1 + self.prior_row_share * mx)
        else:
            per_row = (self._xy / self._w - mx * my) / var
        per_row = min(max(per_row, 0.0), my)
        return max(my - per_row * mx, 0.0), per_row

    def seconds(self, rows: int) -> float:
        fixed, per_row = self.line()
        return fixed + per_row * rows
