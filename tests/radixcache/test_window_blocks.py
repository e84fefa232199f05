"""WindowBlocks: the sliding-window layers' twins of the tree's blocks, on their own."""

from __future__ import annotations

import pytest

from radixcache import Namespace, PrefixCache
from radixcache.integrity import IntegrityError
from radixcache.window_blocks import (
    NULL_BLOCK,
    WindowBlockError,
    WindowBlocks,
    blocks_before_hit,
)

BS = 4
NS = Namespace("m", "float32", BS)


def test_blocks_before_a_hit_hold_the_last_w_minus_1_tokens() -> None:
    assert blocks_before_hit(8, 4) == 2  # 7 keys before the hit: blocks k-2 and k-1
    assert blocks_before_hit(9, 4) == 2
    assert blocks_before_hit(10, 4) == 3
    assert blocks_before_hit(512, 16) == 32
    assert blocks_before_hit(1, 16) == 0


def cached(windows: WindowBlocks, cache: PrefixCache, tokens: list[int]) -> list[int]:
    """Inserts `tokens` with a twin for every block, released: what a finished sequence leaves."""
    n = len(tokens) // BS
    full = cache.allocate(n)
    twins = windows.allocate(n)
    result = cache.insert(NS, tokens, full)
    for f, w in zip(result.block_ids, twins, strict=True):
        windows.adopt(f, w)
    windows.release(twins)
    return result.block_ids


def test_cut_keeps_the_longest_prefix_whose_last_twins_are_there() -> None:
    windows = WindowBlocks(16, 32, BS, window=9)  # a hit reads the 2 blocks before it
    cache = PrefixCache(32, BS, windows=windows)
    full = cached(windows, cache, list(range(40)))  # 10 blocks
    assert windows.cut(full) == 10
    assert windows.evict(7) == full[:7]  # the oldest released first
    assert windows.cut(full) == 10  # blocks 8 and 9 still have theirs
    assert windows.evict(2) == full[7:9]
    assert windows.cut(full) == 0  # no end has both blocks before it
    assert windows.stats().evicted == 9 and cache.stats().windows.tombstones == 9
    cache.check_integrity(window_refs={})


def test_a_cut_stops_before_the_missing_twin() -> None:
    windows = WindowBlocks(16, 32, BS, window=9)
    cache = PrefixCache(32, BS, windows=windows)
    full = cached(windows, cache, list(range(40)))
    kept = [windows.twin_of(f) for i, f in enumerate(full) if i not in (5, 8)]
    for w in kept:  # in use: only the twins of blocks 5 and 8 can be evicted
        windows.hold(w)
    assert sorted(windows.evict(4)) == sorted([full[5], full[8]])
    windows.release(kept)
    assert windows.cut(full) == 8  # a hit at 10 reads block 8; at 8 it reads 6 and 7
    assert windows.cut(full[:6]) == 5
    assert windows.cut(full[:5]) == 5
    cache.check_integrity(window_refs={})


def test_evicting_a_block_frees_its_twin_and_integrity_follows() -> None:
    windows = WindowBlocks(8, 16, BS, window=8)
    cache = PrefixCache(16, BS, windows=windows)
    full = cached(windows, cache, list(range(16)))
    assert windows.stats().cached == 4 and windows.num_free() == 4
    evicted = cache.evict(4)
    assert {e.block_id for e in evicted} == set(full)
    assert all(e.window_block != NULL_BLOCK for e in evicted)  # what a spill tier reads
    assert windows.num_free() == 8 and windows.stats().cached == 0
    cache.check_integrity(window_refs={})


def test_a_twin_in_use_cannot_be_evicted_or_lost() -> None:
    windows = WindowBlocks(4, 8, BS, window=8)
    cache = PrefixCache(8, BS, windows=windows)
    full = cached(windows, cache, list(range(8)))
    w = windows.twin_of(full[1])
    windows.hold(w)  # a sequence reads it
    assert windows.evict(4) == [full[0]]  # only the unused twin goes
    assert windows.twin_of(full[1]) == w
    cache.check_integrity(window_refs={w: 1})
    with pytest.raises(IntegrityError):
        cache.check_integrity(window_refs={})  # a reference nobody accounts for
    with pytest.raises(WindowBlockError):
        windows.release([w, w])  # one reference only
    with pytest.raises(WindowBlockError):
        windows.adopt(full[1], windows.allocate(1)[0])  # block 1 has its twin already
