"""The loader's pace: one segment per engine step while the engine decodes, full speed when it
does not, or when the deadline needs it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from radixcache.hashing import Namespace
from storage.config import TierConfig
from storage.pacing import LoadPacer
from storage.tiered import TieredStore
from tests.storage.blocks import chain, encoded, make_block

FAR = 3600.0


def test_a_decoding_engine_lets_one_segment_through_per_step() -> None:
    pacer = LoadPacer()
    pacer.step_started(decoding=True)
    first = pacer.wait_turn(-1, time.monotonic() + FAR, 2)  # the step it starts in: no wait
    turns: list[int] = []
    waiter = threading.Thread(
        target=lambda: turns.append(pacer.wait_turn(first, time.monotonic() + FAR, 1))
    )
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not turns  # the same step: it waits for the next one
    pacer.step_started(decoding=True)
    waiter.join(10)
    assert turns == [first + 1]


def test_nothing_decoding_or_a_near_deadline_does_not_wait() -> None:
    pacer = LoadPacer()
    step = pacer.wait_turn(-1, time.monotonic() + FAR, 4)
    assert pacer.wait_turn(step, time.monotonic() + FAR, 4) == step  # no steps: not decoding
    pacer.step_started(decoding=True)
    step = pacer.wait_turn(step, time.monotonic() + FAR, 4)
    start = time.monotonic()
    # 4 segments at the first guess of a step (50 ms) do not fit in 0.1 s: read at once
    assert pacer.wait_turn(step, start + 0.1, 4) == step
    assert time.monotonic() - start < 0.1


def test_a_paced_load_needs_a_step_per_segment(tmp_path: Path, ns: Namespace) -> None:
    store = TieredStore(TierConfig(disk_path=tmp_path / "disk", deadline_s=FAR))
    size = store.pacer.segment_blocks
    hashes = chain(ns, 3 * size)
    store.tiers[0].put(ns, encoded(hashes))
    store.step_started(decoding=True)
    pending = store.start_load(ns, hashes)
    steps = 0
    while not pending.wait(0.05):
        store.step_started(decoding=True)
        steps += 1
    assert steps >= 2  # three segments: the first in the step the load began, then one a step
    result = pending.take()
    assert len(result.blocks) == 3 * size
    assert torch.equal(result.blocks[-1], make_block(3 * size - 1))
    store.step_started(decoding=False)  # the engine idle: the next load goes at full speed
    assert store.start_load(ns, hashes).wait(30)
    store.close()
