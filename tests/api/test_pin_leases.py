"""PinLeases on a real engine (the offline LLM's, tiny model) and an injected clock: a prefix is
pinned once per (salt, prefix), a hit extends its lease (never shortens it), expired leases and
everything at shutdown are unpinned exactly once, and a lease that pinned nothing unpins nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from api.serving.pin_leases import PinLeases
from engine.kv.admin import AdminOp, Flush, Lookup, Pin, Unpin
from engine.llm import LLM
from engine.sampling_params import SamplingParams

PROMPT = "A shared system prompt that every request of this test starts with, long enough."


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorded:
    """The engine's admin call, passed through, with the pin and unpin operations it ran."""

    def __init__(self, run: Callable[[AdminOp[Any]], Any]) -> None:
        self.run = run
        self.ops: list[str] = []

    def __call__(self, op: AdminOp[Any]) -> Any:
        if isinstance(op, (Pin, Unpin)):
            self.ops.append(type(op).__name__)
        return self.run(op)


def _cached_prefix(llm: LLM) -> list[int]:
    ids = list(llm.tokenizer.encode(PROMPT))
    llm.generate([PROMPT], SamplingParams(max_tokens=1))
    return ids


def _cached_after_flush(llm: LLM, ids: list[int], salt: str = "") -> int:
    llm.engine.admin(Flush())
    return sum(llm.engine.admin(Lookup(ids, salt)).values())


def test_one_pin_per_prefix_extended_by_hits_and_ended_once(make_llm: Callable[..., LLM]) -> None:
    llm = make_llm()
    ids = _cached_prefix(llm)
    clock, run = Clock(), Recorded(llm.engine.admin)
    leases = PinLeases(run, clock)
    pinned = leases.hold("", ids, 300)
    assert pinned > 0 and leases.hold("", ids, 300) == pinned
    assert run.ops == ["Pin"]  # the second hit only extended the lease
    assert _cached_after_flush(llm, ids) >= pinned
    clock.now += 200
    leases.hold("", ids, 300)  # a hit at +200: the lease runs to +500
    leases.hold("", ids, 1)  # a shorter TTL never shortens it
    clock.now += 299
    assert leases.sweep() == 0 and _cached_after_flush(llm, ids) >= pinned
    clock.now += 1
    assert leases.sweep() == 1 and run.ops == ["Pin", "Unpin"]
    assert leases.leases("") == {} and _cached_after_flush(llm, ids) == 0


def test_release_all_unpins_every_salt_and_an_empty_lease_unpins_nothing(
    make_llm: Callable[..., LLM],
) -> None:
    llm = make_llm()
    ids = _cached_prefix(llm)
    run = Recorded(llm.engine.admin)
    leases = PinLeases(run, Clock())
    assert leases.hold("", ids, 3600) > 0
    assert leases.hold("tenant:x", ids, 3600) == 0  # not cached in that namespace: no pin
    assert run.ops == ["Pin", "Pin"]
    assert leases.release_all() == 2
    assert run.ops == ["Pin", "Pin", "Unpin"]  # the empty lease undid no one's pin
    assert _cached_after_flush(llm, ids) == 0
