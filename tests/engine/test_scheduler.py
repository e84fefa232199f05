"""Scheduler and KV cache manager on a real PrefixCache, without a model: the step loop is simulated
(KV "computed" = counters advanced; a sampled token = a fixed id)."""

from __future__ import annotations

import pytest
import torch

from engine.detokenizer import IncrementalDetokenizer
from engine.kv import KVCacheManager, MatchState
from engine.kv.paged_cache import KVCache
from engine.request import Request, RequestTooLarge, Sequence, SequenceStatus
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from radixcache.hashing import Namespace
from radixcache.prefix_cache import PrefixCache

BS = 4
NS = Namespace("test-model", "float32", BS)


def _setup(num_blocks=32, max_seqs=8, budget=64, max_len=256):
    cache = PrefixCache(num_blocks, BS)
    kv = KVCache(1, num_blocks, BS, 1, 2, torch.float32)
    kv_manager = KVCacheManager(cache, kv)
    return Scheduler(kv_manager, max_seqs, budget, max_len), cache


def _seq(tokens: list[int], priority: int = 0, rid: str = "r") -> Sequence:
    params = SamplingParams(temperature=0, max_tokens=100, priority=priority)
    req = Request(rid, None, list(tokens), params, NS)
    seq = Sequence(req, 0, list(tokens), len(tokens), None, IncrementalDetokenizer(None))
    req.seqs.append(seq)
    return seq


def _step(sched: Scheduler) -> list[tuple[Sequence, int]]:
    """One simulated engine step; returns what was scheduled."""
    batch = sched.schedule()
    for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        sched.kv.computed(seq, n)
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(7)
    return list(zip(batch.seqs, batch.num_new_tokens, strict=True))


def test_chunked_prefill_within_token_budget():
    sched, cache = _setup(budget=4)
    seq = _seq(list(range(10, 20)))
    sched.add(seq)
    assert [n for _, n in _step(sched)] == [4]
    assert [n for _, n in _step(sched)] == [4]
    assert [n for _, n in _step(sched)] == [2]
    assert seq.num_output_tokens == 1
    assert [n for _, n in _step(sched)] == [1]  # decode
    cache.check_integrity()


def test_prefill_and_decode_share_a_step():
    sched, _ = _setup(budget=8)
    a = _seq(list(range(10, 16)), rid="a")
    sched.add(a)
    _step(sched)
    b = _seq(list(range(30, 50)), rid="b")
    sched.add(b)
    scheduled = _step(sched)
    assert [(s.request.request_id, n) for s, n in scheduled] == [("a", 1), ("b", 7)]


def test_max_num_seqs_and_priority_order():
    sched, _ = _setup(max_seqs=2)
    seqs = [_seq([i, i + 1, i + 2], priority=p, rid=str(i)) for i, p in ((1, 5), (10, 0), (20, 1))]
    for s in seqs:
        sched.add(s)
    ids = [s.request.request_id for s, _ in _step(sched)]
    assert ids == ["10", "20"]  # priority 0 then 1; "1" (priority 5) waits
    assert [s.request.request_id for s in sched.waiting] == ["1"]


def test_preemption_releases_blocks_and_keeps_cached_ones():
    sched, cache = _setup(num_blocks=6, budget=64)
    a = _seq(list(range(100, 110)), rid="a")  # 10 tokens: 3 blocks
    b = _seq(list(range(200, 210)), rid="b")
    sched.add(a)
    sched.add(b)
    _step(sched)  # both prefilled: 6 blocks in use
    for _ in range(8):
        _step(sched)
    assert sched.num_preemptions > 0
    assert b.status is SequenceStatus.WAITING and b.block_ids == []
    assert cache.num_evictable_blocks() > 0 or b.num_preemptions > 0
    cache.check_integrity()
    sched.remove(a)
    while b.status is not SequenceStatus.RUNNING:
        _step(sched)
    assert b.num_computed_tokens > 0  # re-admitted with its full blocks matched from the tree
    sched.remove(b)
    cache.check_integrity()
    assert cache.num_free_blocks() + cache.num_evictable_blocks() == 6


def test_requests_that_cannot_fit_are_rejected():
    sched, _ = _setup(num_blocks=4, max_len=64)
    sched.check_fits(10, 6)
    with pytest.raises(RequestTooLarge, match="KV blocks"):
        sched.check_fits(10, 7)
    with pytest.raises(RequestTooLarge, match="KV blocks"):
        sched.check_fits(63, 1)


def test_shared_prefix_in_flight_is_computed_once():
    sched, cache = _setup(budget=8)
    shared = list(range(50, 62))  # 3 blocks
    a, b = _seq(shared + [1, 2], rid="a"), _seq(shared + [3, 4], rid="b")
    sched.add(a)
    sched.add(b)
    first = _step(sched)
    assert [s.request.request_id for s, _ in first] == ["a"]  # b waits for a's blocks
    while b.status is SequenceStatus.WAITING:
        _step(sched)
    assert b.num_cached_tokens == 12  # all three shared blocks came from the tree
    cache.check_integrity()


def test_insert_duplicates_switch_to_the_tree_blocks_and_free_ours():
    sched, cache = _setup(num_blocks=16)
    tokens = list(range(70, 79))  # 2 full blocks + 1
    a, b = _seq(tokens, rid="a"), _seq(tokens, rid="b")
    for seq in (a, b):  # both admitted before either computed anything
        assert sched.kv.match(seq) is MatchState.READY
        assert sched.kv.allocate(seq, seq.num_tokens - seq.num_computed_tokens)
    sched.kv.computed(a, len(tokens) - a.num_computed_tokens)
    b_private = list(b.block_ids[:2])
    sched.kv.computed(b, len(tokens) - b.num_computed_tokens)
    assert b.block_ids[:2] == a.block_ids[:2] != b_private
    assert cache.num_free_blocks() == 16 - 2 - 2  # tree blocks + one partial block each
    cache.check_integrity()
    sched.remove(a)
    sched.remove(b)
    assert cache.num_free_blocks() + cache.num_evictable_blocks() == 16
    cache.check_integrity()
