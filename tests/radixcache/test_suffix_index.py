"""The suffix index (drafts from finished text) and the tree's lookahead (drafts from cached
continuations): longest n-gram first, latest occurrence wins, bounded with the oldest run evicted,
and no namespace (tenant salt included) ever sees another's tokens."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache import Namespace, PrefixCache
from radixcache.suffix_index import SuffixIndex

BS = 4
NS = Namespace("m", "float32", BS)
TENANT = NS.with_salt("tenant-b")


def test_the_continuation_of_the_longest_ngram():
    index = SuffixIndex(ngram_sizes=(3, 2))
    index.add(NS, [1, 2, 3, 4, 5, 6, 9, 3, 7, 8])
    assert index.propose(NS, [0, 1, 2, 3], 3) == [4, 5, 6]  # 3-gram (1, 2, 3)
    assert index.propose(NS, [0, 9, 3], 2) == [7, 8]  # 2-gram (9, 3) beats the 3-gram miss
    assert index.propose(NS, [5, 5], 4) == []
    assert index.propose(NS, [7, 8], 4) == []  # at the end of the run: nothing followed


def test_the_latest_run_wins():
    index = SuffixIndex(ngram_sizes=(2,))
    index.add(NS, [1, 2, 3])
    index.add(NS, [1, 2, 4, 5])
    assert index.propose(NS, [1, 2], 5) == [4, 5]


def test_namespaces_and_tenants_are_apart():
    index = SuffixIndex(ngram_sizes=(2,))
    index.add(NS, [1, 2, 3, 4])
    assert index.propose(TENANT, [1, 2], 2) == []
    assert index.propose(Namespace("other", "float32", BS), [1, 2], 2) == []
    index.add(TENANT, [1, 2, 9])
    assert index.propose(NS, [1, 2], 2) == [3, 4]
    assert index.propose(TENANT, [1, 2], 2) == [9]


def test_bounded_oldest_first():
    index = SuffixIndex(max_tokens=10, ngram_sizes=(2,))
    index.add(NS, [1, 2, 3, 4, 5, 6])
    index.add(NS, [7, 8, 9, 10, 11, 12])  # 12 tokens > 10: the first run goes
    assert len(index) == 1 and index.num_tokens == 6
    assert index.propose(NS, [1, 2], 2) == []
    assert index.propose(NS, [7, 8], 2) == [9, 10]


def test_eviction_keeps_keys_a_newer_run_took_over():
    index = SuffixIndex(max_tokens=8, ngram_sizes=(2,))
    index.add(NS, [1, 2, 3, 4])
    index.add(NS, [1, 2, 5, 6])  # (1, 2) now points here
    index.add(NS, [7, 8, 9, 10])  # evicts the first run
    assert index.propose(NS, [1, 2], 2) == [5, 6]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=12), max_size=8))
def test_every_draft_is_a_real_continuation(runs):
    index = SuffixIndex(max_tokens=24, ngram_sizes=(3, 2))
    for run in runs:
        index.add(NS, run)
    assert index.num_tokens <= 24
    kept = runs[-len(index) :] if len(index) else []
    for run in kept:
        for end in range(2, len(run)):
            draft = index.propose(NS, run[:end], 4)
            assert draft, "an n-gram of a kept run has a continuation"
            assert any(
                r[i : i + 2] == run[end - 2 : end] and r[i + 2 : i + 2 + len(draft)] == draft
                for r in kept
                for i in range(len(r))
            )


def _cached(cache: PrefixCache, tokens: list[int], ns: Namespace = NS) -> None:
    blocks = cache.allocate(len(tokens) // BS)
    res = cache.insert(ns, tokens, blocks)
    cache.free(res.duplicates)


def test_lookahead_continues_into_the_cached_child_and_below():
    cache = PrefixCache(32, BS)
    run = list(range(100, 124))  # 6 blocks
    _cached(cache, run)
    m = cache.match(NS, run[:8])  # a sequence holding 2 blocks, its tail run[8:10]
    cache.lock(m.handle)
    assert cache.lookahead(NS, m.handle, run[8:10], 5) == run[10:15]
    assert cache.lookahead(NS, m.handle, run[8:10], 100) == run[10:]
    assert cache.lookahead(NS, m.handle, [1, 2], 5) == []  # its tail is not cached
    assert cache.lookahead(TENANT, m.handle, run[8:10], 5) == []  # another tenant's handle
    assert cache.lookahead(NS, None, run[:3], 4) == run[3:7]  # nothing locked: the root
    assert cache.lookahead(TENANT, None, run[:3], 4) == []
    cache.unlock(m.handle)
    cache.check_integrity()


def test_the_tree_tells_whether_it_holds_the_next_block():
    """A sequence whose committed blocks end at `handle` asks whether committing its current
    block would switch it to the tree's copy (speculation cuts its drafts there)."""
    cache = PrefixCache(32, BS)
    run = list(range(100, 124))
    _cached(cache, run)
    m = cache.match(NS, run[:8])
    cache.lock(m.handle)
    assert cache.holds_next_block(NS, m.handle, run[8:12])
    assert not cache.holds_next_block(NS, m.handle, [*run[8:11], 7])  # its last token differs
    assert not cache.holds_next_block(NS, m.handle, run[12:16])  # a block further on
    assert not cache.holds_next_block(NS, m.handle, run[8:11])  # not a whole block
    assert not cache.holds_next_block(TENANT, m.handle, run[8:12])
    assert cache.holds_next_block(NS, None, run[:4])
    assert not cache.holds_next_block(TENANT, None, run[:4])
    cache.unlock(m.handle)
    cache.check_integrity()
