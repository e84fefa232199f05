"""LoadPacer: how fast the loader thread may read while the engine decodes.

On a small CPU the loader's work (reading, decoding, and on Redis the server's replies, all on the
engine's cores) is taken from the engine's threads: a 128-block load read at full speed stalls one
or two steps of every running stream. Paced, the loader reads one segment of `segment_blocks` per
engine step while sequences decode, so each step loses a little instead; with nothing decoding,
or when a load would otherwise miss its deadline, it reads at full speed.
"""

from __future__ import annotations

import threading
import time

PACED_SEGMENT_BLOCKS = 8
_DEADLINE_MARGIN = 1.5  # go at full speed once the paced rest would take 1/1.5 of the time left


class LoadPacer:
    """Shared by the engine thread (step_started) and the loader thread (wait_turn)."""

    def __init__(self, segment_blocks: int = PACED_SEGMENT_BLOCKS) -> None:
        self.segment_blocks = segment_blocks
        self._cond = threading.Condition()
        self._step = 0
        self._decoding = False
        self._last_tick = time.monotonic()
        self._step_s = 0.05  # recent time between steps (EMA), before the first steps are seen

    def step_started(self, decoding: bool) -> None:
        """The engine starts a step; `decoding`: sequences are running whose tokens pacing
        protects (False: the engine has nothing else to do, the loader may take every core)."""
        now = time.monotonic()
        with self._cond:
            if self._decoding:
                self._step_s += 0.2 * (now - self._last_tick - self._step_s)
            self._last_tick, self._decoding = now, decoding
            self._step += 1
            self._cond.notify_all()

    def wait_turn(self, last_step: int, deadline: float, segments_left: int) -> int:
        """Blocks the loader until it may read its next segment: a step started since
        `last_step` (the value this returned before; -1 at first), or nothing is decoding, or
        the `segments_left` paced segments would no longer fit before `deadline`. Returns the
        step it read in."""
        with self._cond:
            while self._decoding and self._step == last_step:
                slack = (
                    deadline - time.monotonic() - _DEADLINE_MARGIN * segments_left * self._step_s
                )
                if slack <= 0:
                    break
                self._cond.wait(slack)
            return self._step
