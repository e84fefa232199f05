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


def test_a_decoding_engine_lets_the_loader_use_its_share_of_each_step() -> None:
    pacer = LoadPacer(share=0.1)
    pacer.step_started(decoding=True)
    pacer.wait_turn(0.0, time.monotonic() + FAR, 3)  # the first segment of a step: no wait
    pacer.wait_turn(0.001, time.monotonic() + FAR, 2)  # 1 ms < 10% of a 50 ms step: no wait
    done = threading.Event()

    def next_segment() -> None:
        pacer.wait_turn(0.009, time.monotonic() + FAR, 1)  # 10 ms spent: the share is used
        done.set()

    waiter = threading.Thread(target=next_segment)
    waiter.start()
    assert not done.wait(0.3)  # it waits for the next step
    pacer.step_started(decoding=True)
    assert done.wait(10)
    waiter.join()


def test_nothing_decoding_or_a_near_deadline_does_not_wait() -> None:
    pacer = LoadPacer(share=0.0)  # one segment a step
    pacer.wait_turn(0.0, time.monotonic() + FAR, 4)
    pacer.wait_turn(0.01, time.monotonic() + FAR, 4)  # no steps seen: nothing decoding
    pacer.step_started(decoding=True)
    pacer.wait_turn(0.01, time.monotonic() + FAR, 4)
    start = time.monotonic()
    # 4 more segments at a step each (the first guess of a step: 50 ms) miss a 0.1 s deadline
    pacer.wait_turn(0.01, start + 0.1, 4)
    assert time.monotonic() - start < 0.1


def test_a_paced_load_needs_a_step_per_segment(tmp_path: Path, ns: Namespace) -> None:
    store = TieredStore(TierConfig(disk_path=tmp_path / "disk", deadline_s=FAR))
    store.pacer.share = 0.0  # one segment a step
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
