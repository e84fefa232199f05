"""The drafting parts alone: prompt lookup over a growing sequence, the draft length from the
chances and the step cost, the fitted step cost."""

from __future__ import annotations

import random
from array import array

import pytest

from engine.speculative.draft_length import FirstTokenRates, SourceRates, draft_plan
from engine.speculative.prompt_lookup import PromptLookup
from engine.speculative.step_cost import StepCost


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


def test_draft_length_follows_the_chances_and_the_threshold():
    later = SourceRates()
    for _ in range(30):  # a copy source: when its first token holds, the rest does
        later.record(8, 8)
    assert draft_plan(0.9, later, threshold=0.2, max_tokens=8)[0] == 8
    assert draft_plan(0.9, later, threshold=0.95, max_tokens=8)[0] == 0  # rows too dear
    assert draft_plan(0.1, later, threshold=0.2, max_tokens=8)[0] == 0
    assert draft_plan(0.1, later, threshold=0.03, max_tokens=8)[0] == 8  # a small batch
    fickle = SourceRates()
    for _ in range(30):  # the second token holds half the time, the third never
        fickle.record(4, 1)
        fickle.record(4, 2)
    assert fickle.rate(1) == pytest.approx(31 / 62) and fickle.rate(2) == pytest.approx(1 / 32)
    assert draft_plan(0.8, fickle, threshold=0.15, max_tokens=8)[0] == 2  # 0.8, 0.4, 0.0125


def test_draft_plan_prefers_the_source_with_the_larger_expected_gain():
    copy, fickle = SourceRates(), SourceRates()
    for _ in range(30):
        copy.record(8, 8)
        fickle.record(4, 1)
    k_copy, gain_copy = draft_plan(0.6, copy, threshold=0.1, max_tokens=8)
    k_fickle, gain_fickle = draft_plan(0.9, fickle, threshold=0.1, max_tokens=8)
    assert (k_copy, k_fickle) == (8, 1)  # a likelier first token, but nothing after it
    assert gain_copy > gain_fickle > 0
    assert draft_plan(0.05, copy, threshold=0.1, max_tokens=8) == (0, 0.0)


def test_first_token_rate_moves_with_what_is_observed():
    engine_wide, first = SourceRates(), FirstTokenRates()
    assert first.get("ngram", engine_wide) == 0.5  # nothing seen anywhere
    for _ in range(12):
        first.observe("ngram", engine_wide, hit=False)
    assert first.get("ngram", engine_wide) < 0.05
    assert first.get("tree", engine_wide) == 0.5  # per source
    for _ in range(6):
        first.observe("ngram", engine_wide, hit=True)
    assert first.get("ngram", engine_wide) > 0.8


def test_step_cost_fits_a_line_and_clips_outliers():
    cost = StepCost()
    assert cost.line() == (1.0, cost.prior_row_share)  # before any step: the prior share
    for rows in [8, 16, 24, 40, 8, 12] * 5:
        cost.record(rows, 0.018 + 0.0005 * rows)
    fixed, per_row = cost.line()
    assert fixed == pytest.approx(0.018, rel=1e-6) and per_row == pytest.approx(0.0005, rel=1e-6)
    cost.record(8, 5.0)  # one stalled step counts as at most 3x the line
    assert cost.seconds(8) < 0.1
    flat = StepCost()
    for _ in range(20):
        flat.record(8, 0.02)
    fixed, per_row = flat.line()  # rows never varied: the prior share, same mean
    assert per_row == pytest.approx(flat.prior_row_share * fixed)
    assert fixed + 8 * per_row == pytest.approx(0.02)
