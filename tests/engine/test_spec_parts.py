"""The drafting parts alone: prompt lookup over a growing sequence, and the adaptive length."""

from __future__ import annotations

import random
from array import array

from engine.spec.draft_length import FIRST_DRAFT, MAX_PAUSE, DraftLength
from engine.spec.prompt_lookup import PromptLookup


def _tokens(ids: list[int]) -> array:
    return array("q", ids)


def test_lookup_continues_the_latest_earlier_occurrence():
    lookup = PromptLookup((3, 2))
    seq = _tokens([1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2, 3])
    assert lookup.propose(seq, 3) == [4, 5, 9]  # the 3-gram (1, 2, 3) first
    seq.extend([4, 1, 2, 3, 8, 1, 2, 3])
    assert lookup.propose(seq, 3) == [8, 1, 2]  # its latest earlier occurrence
    seq.extend([6, 2, 3])
    assert lookup.propose(seq, 1) == [6]  # (6, 2, 3) unseen: the 2-gram (2, 3), latest
    assert PromptLookup((3,)).propose(_tokens([5, 6, 7]), 4) == []  # only the current occurrence


def test_growing_sequence_matches_a_fresh_index():
    rng = random.Random(0)
    seq = _tokens([rng.randrange(6) for _ in range(5)])
    grown = PromptLookup((4, 3, 2))
    for _ in range(200):
        seq.append(rng.randrange(6))
        assert grown.propose(seq, 4) == PromptLookup((4, 3, 2)).propose(seq, 4)


def test_draft_length_grows_shrinks_and_pauses():
    length = DraftLength(max_tokens=8)
    assert length.next() == FIRST_DRAFT
    length.record(2, 2)
    assert length.next() == 4
    length.record(4, 4)
    assert length.next() == 8
    length.record(8, 8)
    assert length.next() == 8  # bounded
    length.record(8, 3)
    assert length.next() == 4  # one past what held
    length.record(4, 0)
    assert [length.next() for _ in range(3)] == [0, 0, 1]  # a miss pauses two steps
    for _ in range(10):
        length.record(1, 0)
    assert length.pause == MAX_PAUSE
