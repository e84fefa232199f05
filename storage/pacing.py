"""LoadPacer: how much of each engine step the loader thread may take while the engine decodes.

On a small CPU the loader's work (reading, decoding, and on Redis the server's replies, all on the
engine's cores) is taken from the engine's threads: a 128-block load read at full speed stalls one
or two steps of every running stream. Paced, the loader reads segments of `segment_blocks` until
it has spent `share` of a step's time (at least one segment per step) and then waits for the next
step, so each step loses a little instead; with nothing decoding, or when a load would otherwise
miss its deadline, it reads at full speed.
"""

from __future__ import annotations

import threading
import time

PACED_SEGMENT_BLOCKS = 8
STEP_SHARE = 0.1  # of a step's time the loader (and, engine side, the copy-in) may use
_DEADLINE_MARGIN = 1.5  # full speed once the paced rest would take 1/1.5 of the time left


class LoadPacer:
    """Shared by the engine thread (step_started) and the loader thread (wait_turn)."""

    def __init__(self, segment_blocks: int = PACED_SEGMENT_BLOCKS, share: float = STEP_SHARE):
        self.segment_blocks = segment_blocks
        self.share = share
        self._cond = threading.Condition()
        self._decoding = False
        self._last_tick = time.monotonic()
        self.step_s = 0.05  # recent time between decoding steps (EMA), before steps are seen
        self._segment_s = 0.0  # recent time the loader took for one segment (EMA)
        self._spent = 0.0  # loader seconds in the current step
        self._segments = 0  # segments read in the current step
        self._jobs = 0  # loads started and not finished (the one being read and those behind it)

    def job_started(self) -> None:
        with self._cond:
            self._jobs += 1

    def job_finished(self) -> None:
        with self._cond:
            self._jobs -= 1

    def step_started(self, decoding: bool) -> None:
        """The engine starts a step; `decoding`: sequences are running whose tokens pacing
        protects (False: the engine has nothing else to do, the loader may take every core)."""
        now = time.monotonic()
        with self._cond:
            if self._decoding:
                self.step_s += 0.2 * (now - self._last_tick - self.step_s)
            self._last_tick, self._decoding = now, decoding
            self._spent, self._segments = 0.0, 0
            self._cond.notify_all()

    def wait_turn(self, spent_s: float, deadline: float, segments_left: int) -> None:
        """Called by the loader before each segment, with the seconds the previous one took (0
        before the first); blocks while it has used its share of this step, unless nothing is
        decoding or the `segments_left` would no longer fit before `deadline` at this pace (the
        loads queued behind this one count as as many segments each: they have deadlines too)."""
        with self._cond:
            if spent_s:
                self._spent += spent_s
                self._segment_s += 0.3 * (spent_s - self._segment_s)
            # paced, a segment takes a step, or less where several fit in a step's share
            per_segment = self.step_s
            if self.share > 0:
                per_segment = min(per_segment, self._segment_s / self.share)
            while self._over_share():
                paced_rest = segments_left * max(1, self._jobs) * per_segment
                slack = deadline - time.monotonic() - _DEADLINE_MARGIN * paced_rest
                if slack <= 0:
                    break
                self._cond.wait(slack)
            self._segments += 1

    def _over_share(self) -> bool:
        return self._decoding and self._segments > 0 and self._spent >= self.share * self.step_s
