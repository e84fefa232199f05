"""Block hashes are computed when someone needs them, once, and always chain from the root."""

import pytest

from radixcache import IntegrityError, Namespace, PrefixCache, block_hashes


def insert(cache: PrefixCache, ns: Namespace, tokens: list[int]):
    blocks = cache.allocate(len(tokens) // ns.block_size)
    assert blocks is not None
    res = cache.insert(ns, tokens, blocks)
    cache.free(res.duplicates)
    return res


@pytest.mark.parametrize("bs", [1, 4])
def test_insert_and_match_hash_nothing_until_asked(bs: int):
    ns = Namespace("m", "float32", bs)
    cache = PrefixCache(64, bs)
    tokens = list(range(100, 100 + 8 * bs))
    insert(cache, ns, tokens)
    insert(cache, ns, tokens[: 4 * bs] + list(range(900, 900 + 4 * bs)))  # splits the first
    m = cache.match(ns, tokens + [1])
    assert not cache.pool.hash_index and len(cache.tree.unhashed) == 3
    cache.check_integrity()
    assert m.last_hash == block_hashes(ns, tokens)[-1]  # computed on read
    assert cache.hashes_of(m.handle) == block_hashes(ns, tokens)
    assert len(cache.pool.hash_index) == 8 and len(cache.tree.unhashed) == 1
    cache.check_integrity()


def test_peek_last_hash_inside_a_node():
    bs = 2
    ns = Namespace("m", "float32", bs)
    cache = PrefixCache(32, bs)
    tokens = list(range(10, 30))
    insert(cache, ns, tokens)
    p = cache.peek(ns, tokens[:6] + [0, 0, 0])
    assert p.num_tokens == 6 and p.last_hash == block_hashes(ns, tokens[:6])[-1]
    assert len(cache.tree.iter_nodes()) == 2  # peek did not split


def test_drop_frees_without_hashing_and_evict_hashes_what_it_hands_back():
    bs = 1
    ns = Namespace("m", "float32", bs)
    cache = PrefixCache(40, bs)
    a = list(range(100, 120))
    b = list(range(100, 110)) + list(range(500, 510))
    insert(cache, ns, a)
    insert(cache, ns, b)
    assert cache.drop(5) == 5 and not cache.pool.hash_index
    assert cache.stats().namespaces[ns].evicted_blocks == 5
    cache.check_integrity()
    evicted = cache.evict(3)
    assert len(evicted) == 3
    for e in evicted:  # each handed-back block carries its chained hash
        seq = a if e.tokens[0] in a[10:] else b
        depth = next(i for i, t in enumerate(seq) if t == e.tokens[0] and i >= 10)
        assert e.block_hash == block_hashes(ns, seq[: depth + 1])[-1]
    cache.check_integrity()
    assert cache.num_free_blocks() == 40 - 30 + 8


def test_lookup_hash_sees_every_cached_block():
    bs = 4
    ns = Namespace("m", "float32", bs)
    cache = PrefixCache(16, bs)
    tokens = list(range(0, 12))
    res = insert(cache, ns, tokens)
    h = block_hashes(ns, tokens)
    assert cache.lookup_hash(ns, h[1], tokens[4:8]) == res.block_ids[1]
    assert cache.lookup_hash(ns, h[1], tokens[0:4]) is None  # hash hit, tokens differ
    cache.check_integrity()


def test_integrity_catches_a_wrong_hash_and_stale_samples():
    bs = 2
    ns = Namespace("m", "float32", bs)
    cache = PrefixCache(16, bs, mrc_sample_rate=1.0)
    res = insert(cache, ns, list(range(8)))
    cache.hashes_of(res.handle)
    cache.check_integrity()
    node = res.handle
    good = node.hashes
    node.hashes = (good[0] ^ 1, *good[1:])
    with pytest.raises(IntegrityError):
        cache.check_integrity()
    node.hashes = good
    node.units = node.units[:-1]
    with pytest.raises(IntegrityError):
        cache.check_integrity()


def test_caller_copies_of_cached_blocks_are_duplicates_at_block_size_1():
    ns = Namespace("m", "float32", 1)
    cache = PrefixCache(32, 1)
    first = insert(cache, ns, list(range(50, 60)))
    mine = cache.allocate(12)
    res = cache.insert(ns, list(range(50, 62)), mine)
    assert res.block_ids[:10] == first.block_ids and res.duplicates == mine[:10]
    cache.free(res.duplicates)
    again = cache.insert(ns, list(range(50, 62)), res.block_ids)  # the tree's own ids
    assert again.duplicates == [] and again.block_ids == res.block_ids
    cache.check_integrity()


@pytest.mark.parametrize("bs", [1, 3])
def test_array_tokens_behave_like_lists(bs: int):
    """Callers may pass array("q") or numpy token ids (compared as memory): same results."""
    import random
    from array import array

    import numpy as np

    ns = Namespace("m", "float32", bs)
    rng = random.Random(bs)
    lists, mixed = PrefixCache(400, bs), PrefixCache(400, bs)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randrange(1, 30))] for _ in range(6)]
    for step in range(120):
        tokens = rng.choice(prefixes)[: rng.randrange(0, 30)] + [rng.randrange(1000)] * (step % 4)
        kind = rng.choice([array("q", tokens), np.array(tokens, dtype=np.int32), tokens])
        a, b = lists.match(ns, tokens), mixed.match(ns, kind)
        assert (a.block_ids, a.num_tokens, a.last_hash) == (b.block_ids, b.num_tokens, b.last_hash)
        assert lists.peek(ns, tokens).num_tokens == mixed.peek(ns, kind).num_tokens
        for cache, toks in ((lists, tokens), (mixed, kind)):
            m = cache.match(ns, toks)
            blocks = cache.allocate(len(tokens) // bs - len(m.block_ids))
            if blocks is None:
                cache.evict(cache.num_evictable_blocks())
                continue
            res = cache.insert(ns, toks, m.block_ids + blocks)
            cache.free(res.duplicates)
        if step % 17 == 0:
            assert len(lists.evict(5)) == len(mixed.evict(5))
        mixed.check_integrity()
    assert lists.stats().namespaces[ns] == mixed.stats().namespaces[ns]
