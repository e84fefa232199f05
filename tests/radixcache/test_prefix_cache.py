import pytest

from radixcache import EvictedBlock, IntegrityError, Namespace, PrefixCache, block_hashes
from radixcache.prefix_cache import StaleHandleError

BS = 4
NS = Namespace("m", "float32", BS)


def seq(start: int, n_blocks: int) -> list[int]:
    return list(range(start, start + n_blocks * BS))


def cached(cache: PrefixCache, tokens: list[int], ns: Namespace = NS):
    """Allocate, insert and release a sequence, as the engine does after a request."""
    blocks = cache.allocate(len(tokens) // BS)
    assert blocks is not None
    res = cache.insert(ns, tokens, blocks)
    cache.free(res.duplicates)
    return res


def test_empty_match():
    cache = PrefixCache(8, BS)
    m = cache.match(NS, seq(0, 3))
    assert m.block_ids == [] and m.num_tokens == 0 and m.last_hash is None
    cache.lock(m.handle)
    cache.unlock(m.handle)
    cache.check_integrity()


def test_insert_then_match_whole_blocks_only():
    cache = PrefixCache(8, BS)
    tokens = seq(100, 3)
    res = cached(cache, tokens)
    assert res.duplicates == [] and len(res.block_ids) == 3
    m = cache.match(NS, tokens + [1, 2])  # the partial tail block is never matched
    assert m.block_ids == res.block_ids and m.num_tokens == 12
    assert m.last_hash == block_hashes(NS, tokens)[-1]
    assert cache.hashes_of(m.handle) == block_hashes(NS, tokens)
    assert cache.num_free_blocks() == 5 and cache.num_evictable_blocks() == 3
    cache.check_integrity()


def test_match_inside_a_node_splits_it():
    cache = PrefixCache(8, BS)
    res = cached(cache, seq(100, 4))
    m = cache.match(NS, seq(100, 2) + [7, 7, 7, 7])
    assert m.block_ids == res.block_ids[:2] and m.num_tokens == 8
    cache.lock(m.handle)  # locks exactly the two matched blocks
    assert cache.num_evictable_blocks() == 2
    assert len(cache.evict(10)) == 2
    assert cache.match(NS, seq(100, 4)).block_ids == res.block_ids[:2]
    cache.unlock(m.handle)
    cache.check_integrity()


def test_divergent_inserts_share_the_prefix_and_report_duplicates():
    cache = PrefixCache(16, BS)
    first = cached(cache, seq(0, 3))
    other = seq(0, 2) + seq(500, 2)
    blocks = cache.allocate(4)
    res = cache.insert(NS, other, blocks)
    assert res.block_ids[:2] == first.block_ids[:2] and res.block_ids[2:] == blocks[2:]
    assert res.duplicates == blocks[:2]
    cache.free(res.duplicates)
    assert cache.match(NS, seq(0, 3)).block_ids == first.block_ids
    assert cache.match(NS, other).block_ids == res.block_ids
    again = cache.insert(NS, other, res.block_ids)  # re-inserting the tree's own ids is a no-op
    assert again.duplicates == [] and again.block_ids == res.block_ids
    cache.check_integrity()


def test_lock_protects_the_path_and_allocate_fails_cleanly():
    cache = PrefixCache(6, BS)
    res = cached(cache, seq(0, 4))
    cache.lock(res.handle)
    assert not cache.can_allocate(3) and cache.allocate(3) is None
    assert cache.num_free_blocks() == 2 and cache.stats().referenced == 4
    assert len(cache.evict(4)) == 0
    cache.unlock(res.handle)
    assert cache.can_allocate(6) and len(cache.allocate(6)) == 6
    assert cache.match(NS, seq(0, 4)).block_ids == []
    cache.check_integrity()


def test_unlock_more_than_locked_raises():
    cache = PrefixCache(4, BS)
    res = cached(cache, seq(0, 1))
    with pytest.raises(ValueError):
        cache.unlock(res.handle)
    cache.check_integrity()  # the failed unlock changed nothing


def test_evict_is_lru_and_tail_first():
    events: list[list[EvictedBlock]] = []
    cache = PrefixCache(16, BS)
    old = cached(cache, seq(0, 3))
    new = cached(cache, seq(1000, 3))
    cache.match(NS, seq(1000, 3))
    events.append(cache.evict(1))
    assert len(events[0]) == 1
    assert [e.block_id for e in events[0]] == [old.block_ids[2]]  # tail of the older leaf
    cache.match(NS, seq(0, 2))  # the old prefix is now the most recent
    events.append(cache.evict(2))
    assert len(events[1]) == 2
    assert [e.block_id for e in events[1]] == new.block_ids[1:][::-1] or [
        e.block_id for e in events[1]
    ] == new.block_ids[1:]
    assert cache.match(NS, seq(0, 3)).num_tokens == 8
    cache.check_integrity()


def test_evict_hands_back_the_blocks_before_their_ids_are_reused():
    cache = PrefixCache(4, BS)
    tokens = seq(40, 3)
    res = cached(cache, tokens)
    seen = cache.evict(4 - cache.num_free_blocks())
    assert len(cache.allocate(4)) == 4
    assert sorted(b.block_id for b in seen) == sorted(res.block_ids)
    by_id = {b.block_id: b for b in seen}
    hashes = block_hashes(NS, tokens)
    for i, b in enumerate(res.block_ids):
        assert by_id[b].tokens == tokens[i * BS : (i + 1) * BS]
        assert by_id[b].block_hash == hashes[i] and by_id[b].namespace == NS
    assert cache.stats().namespaces[NS].evicted_blocks == 3


def test_pin_survives_eviction_and_is_capped():
    cache = PrefixCache(8, BS, max_pinned_fraction=0.25)
    cached(cache, seq(0, 3))
    assert cache.pin(NS, seq(0, 3)) == 8  # the cap is 2 blocks
    assert cache.stats().pinned == 2
    assert len(cache.evict(8)) == 1 and len(cache.flush()) == 0
    assert cache.match(NS, seq(0, 3)).num_tokens == 8
    assert cache.allocate(7) is None
    assert cache.unpin(NS, seq(0, 3)) == 8
    assert cache.unpin(NS, seq(0, 3)) == 0
    assert len(cache.flush()) == 2
    cache.check_integrity()


def test_namespaces_never_share_blocks():
    cache = PrefixCache(16, BS)
    other = NS.with_salt("tenant")
    a = cached(cache, seq(0, 2))
    assert cache.match(other, seq(0, 2)).block_ids == []
    b = cached(cache, seq(0, 2), ns=other)
    assert not set(a.block_ids) & set(b.block_ids)
    assert len(cache.flush(other)) == 2
    assert cache.match(NS, seq(0, 2)).block_ids == a.block_ids
    assert cache.match(other, seq(0, 2)).block_ids == []
    with pytest.raises(ValueError):
        cache.match(Namespace("m", "float32", 8), seq(0, 2))
    cache.check_integrity()


def test_collision_guard_with_a_constant_hash():
    def colliding(ns, tokens, parent_hash=None):
        return [42] * (len(tokens) // ns.block_size)

    cache = PrefixCache(8, BS, hash_fn=colliding)
    a = cached(cache, seq(0, 1))
    b = cached(cache, seq(900, 1))
    assert a.block_ids != b.block_ids
    assert cache.match(NS, seq(0, 1)).block_ids == a.block_ids
    assert cache.match(NS, seq(900, 1)).block_ids == b.block_ids
    assert cache.lookup_hash(NS, 42, seq(0, 1)) == a.block_ids[0]
    assert cache.lookup_hash(NS, 42, seq(900, 1)) is None  # hash hit, tokens differ
    assert cache.stats().hash_collisions == 1
    cache.check_integrity()


def test_invalid_inserts_raise():
    cache = PrefixCache(4, BS)
    with pytest.raises(ValueError):
        cache.insert(NS, seq(0, 1), [0])  # a free block, not the caller's
    blocks = cache.allocate(1)
    with pytest.raises(ValueError):
        cache.insert(NS, seq(0, 1)[:3], blocks)


def test_stale_handle_is_rejected():
    cache = PrefixCache(4, BS)
    res = cached(cache, seq(0, 1))
    cache.evict(1)
    with pytest.raises(StaleHandleError):
        cache.lock(res.handle)


def test_stats_and_hottest_prefixes():
    cache = PrefixCache(16, BS)
    cached(cache, seq(0, 2))
    cached(cache, seq(0, 1) + seq(300, 1))
    for _ in range(3):
        cache.match(NS, seq(0, 2) + [1])
    s = cache.stats().namespaces[NS]
    assert (s.lookups, s.lookup_tokens, s.hit_tokens, s.inserted_blocks) == (3, 27, 24, 3)
    top = cache.hottest_prefixes(2)
    assert [(p.num_tokens, p.hits) for p in top] == [(8, 3), (4, 3)]  # ties: longer first
    assert top[0].token_ids == seq(0, 2) and top[1].token_ids == seq(0, 1)
    assert cache.hottest_prefixes(5, NS.with_salt("x")) == []


def test_integrity_check_catches_corruption():
    cache = PrefixCache(4, BS)
    res = cached(cache, seq(0, 2))
    cache.check_integrity()
    res.handle.lock_ref = 1  # a lock the counters do not know about
    with pytest.raises(IntegrityError):
        cache.check_integrity()


def test_peek_changes_nothing():
    cache = PrefixCache(8, BS)
    res = cached(cache, seq(0, 3))
    nodes = len(cache.tree.iter_nodes())
    p = cache.peek(NS, seq(0, 2) + [9, 9, 9, 9])
    assert p.block_ids == res.block_ids[:2] and p.num_tokens == 8
    assert p.last_hash == block_hashes(NS, seq(0, 2))[-1]
    assert len(cache.tree.iter_nodes()) == nodes and cache.stats().namespaces[NS].lookups == 0
    assert cache.is_cached(res.block_ids[0]) and not cache.is_cached(cache.pool.free_ids()[0])


@pytest.mark.parametrize("diverge", [1, 2, 3, 5, 8, 13, 31, 32, 63])
def test_divergence_anywhere_in_a_long_node(diverge: int):
    cache = PrefixCache(160, BS)
    base = cached(cache, seq(0, 64))
    query = seq(0, 64)
    query[diverge * BS + 1] = -1  # block `diverge` differs
    m = cache.match(NS, query)
    assert m.block_ids == base.block_ids[:diverge] and m.num_tokens == diverge * BS
    assert cache.peek(NS, query).block_ids == base.block_ids[:diverge]
    cache.check_integrity()
