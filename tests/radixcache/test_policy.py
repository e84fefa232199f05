import pytest

from radixcache import Namespace, PrefixCache
from radixcache.policy import FrequencyAgeingPolicy, LRUPolicy, make_policy
from radixcache.policy_learned import LearnedReusePolicy, tail_class

BS = 4
NS = Namespace("m", "float32", BS)


def seq(start: int, n_blocks: int) -> list[int]:
    return list(range(start, start + n_blocks * BS))


def cached(cache: PrefixCache, tokens: list[int]):
    res = cache.insert(NS, tokens, cache.allocate(len(tokens) // BS))
    cache.free(res.duplicates)
    return res


def evicted_order(cache: PrefixCache, n: int) -> list[int]:
    return [b.block_id for b in cache.evict(n)]


def test_a_probationary_block_goes_before_a_reused_one():
    cache = PrefixCache(16, BS, policy=FrequencyAgeingPolicy())
    reused = cached(cache, seq(0, 1))
    cache.match(NS, seq(0, 1))
    newcomer = cached(cache, seq(100, 1))  # newer, but never hit
    assert evicted_order(cache, 1) == newcomer.block_ids
    lru = PrefixCache(16, BS, policy=LRUPolicy())
    old = cached(lru, seq(0, 1))
    lru.match(NS, seq(0, 1))
    cached(lru, seq(100, 1))
    assert evicted_order(lru, 1) == old.block_ids  # LRU drops the older, reused block
    assert cache.match(NS, seq(0, 1)).block_ids == reused.block_ids


def test_ageing_lets_stale_frequent_blocks_go():
    cache = PrefixCache(64, BS, policy=FrequencyAgeingPolicy(ghost_factor=0))
    stale = cached(cache, seq(0, 1))
    for _ in range(3):
        cache.match(NS, seq(0, 1))  # freq 4: priority 1 + log2(4) = 3 above the floor
    for i in range(8):  # each round evicts a newcomer, raising the floor by about 1
        cached(cache, seq(1000 + 10 * i, 1))
        cache.evict(1)
    assert stale.block_ids[0] in evicted_order(cache, 1) + evicted_order(cache, 1)


def test_ghost_history_restores_frequency():
    policy = FrequencyAgeingPolicy(ghost_factor=4)
    cache = PrefixCache(8, BS, policy=policy)
    cached(cache, seq(0, 1))
    for _ in range(3):
        cache.match(NS, seq(0, 1))
    cache.flush()
    again = cached(cache, seq(0, 1))
    cached(cache, seq(100, 1))
    assert cache.tree.block_node[again.block_ids[0]].freq == 5
    assert evicted_order(cache, 1) != again.block_ids


@pytest.mark.parametrize("name", ["lru", "freq-ageing", "learned"])
def test_pins_and_locks_are_never_chosen(name: str):
    cache = PrefixCache(6, BS, policy=make_policy(name), max_pinned_fraction=0.5)
    pinned = cached(cache, seq(0, 2))
    cache.pin(NS, seq(0, 2))
    locked = cached(cache, seq(100, 2))
    cache.lock(locked.handle)
    cached(cache, seq(200, 2))
    out = evicted_order(cache, 6)
    assert len(out) == 2 and not set(out) & set(pinned.block_ids + locked.block_ids)
    assert cache.num_free_blocks() == 2 and cache.allocate(3) is None
    cache.check_integrity()


def test_unknown_policy_name():
    with pytest.raises(ValueError):
        make_policy("fifo")


def test_policy_by_name_and_default():
    assert PrefixCache(4, BS).stats().policy == "lru"
    assert PrefixCache(4, BS, policy="freq-ageing").stats().policy == "freq-ageing"


def one_block(i: int) -> list[int]:
    return seq(1000 + 10 * i, 1)


def test_learned_keeps_reread_blocks_when_newcomers_are_one_shot():
    cache = PrefixCache(64, BS, policy=LearnedReusePolicy())
    for i in range(20):  # one-shot blocks: class ("new", 0, 1) is never read again
        cached(cache, one_block(i))
    reread = [cached(cache, seq(100 * j, 2)) for j in range(1, 6)]
    for _ in range(6):  # uses capped at 4: ("hit", 4) gathers evidence from the 5th read on
        for j in range(1, 6):
            cache.match(NS, seq(100 * j, 2))
    newcomer = cached(cache, one_block(99))
    victims = evicted_order(cache, 21)
    assert newcomer.block_ids[0] in victims
    assert not {r.block_ids[0] for r in reread} & set(victims)


def test_learned_turns_lru_like_when_rereads_do_not_repeat():
    # every block is read exactly once after it is inserted (a finite shared-prefix group):
    # the policy learns that a re-read block is done, and drops it before a fresh one
    cache = PrefixCache(64, BS, policy=LearnedReusePolicy())
    for i in range(20):
        cached(cache, one_block(i))
        cache.match(NS, one_block(i))
    done = cached(cache, one_block(50))
    cache.match(NS, one_block(50))
    fresh = cached(cache, one_block(51))
    order = evicted_order(cache, 64)
    assert order.index(done.block_ids[0]) < order.index(fresh.block_ids[0])


def test_learned_ghost_history_credits_the_evicted_class():
    policy = LearnedReusePolicy(ghost_factor=4)
    cache = PrefixCache(8, BS, policy=policy)
    cached(cache, seq(0, 2))
    cache.match(NS, seq(0, 2))
    cache.flush()
    assert not policy.node_class  # per-node state goes with the node
    before = policy.reuse_probability(("hit", 1))
    again = cached(cache, seq(0, 2))
    assert cache.tree.block_node[again.block_ids[0]].freq == 3
    assert policy.reuse_probability(("hit", 1)) > before


def test_learned_counters_decay():
    policy = LearnedReusePolicy(decay_factor=1)
    cache = PrefixCache(4, BS, policy=policy)
    for i in range(12):
        cached(cache, one_block(i))
    assert sum(policy.refs.values()) <= 2 * 4 + 1


def trained_on_rewritten_tails(n_turns: int = 30) -> tuple[PrefixCache, LearnedReusePolicy]:
    """Chat-like history: each turn's next request reads its first blocks, never its last one."""
    policy = LearnedReusePolicy()
    cache = PrefixCache(256, BS, policy=policy)
    for i in range(n_turns):
        cached(cache, seq(1000 * i, 3))
        cache.match(NS, seq(1000 * i, 2))
    cache.flush()  # learned counters stay; the blocks go
    return cache, policy


def test_learned_prices_an_unread_tail_apart_from_its_body():
    cache, policy = trained_on_rewritten_tails()
    body, tail = ("new", 0, 2), tail_class(("new", 0, 2))
    assert policy.reuse_probability(tail) < policy.floor < policy.reuse_probability(body)
    older = cached(cache, seq(98000, 3))
    newer = cached(cache, seq(99000, 3))
    node = cache.tree.block_node[newer.block_ids[0]]
    assert node.tail_prio is not None and node.tail_prio < node.prio
    # both unread tails go before either body, one block each, and the clock takes the
    # victim's (tail) priority, not its body's
    assert evicted_order(cache, 2) == [older.block_ids[2], newer.block_ids[2]]
    assert policy.clock < node.prio
    assert cache.match(NS, seq(98000, 3)).block_ids == older.block_ids[:2]
    assert cache.match(NS, seq(99000, 3)).block_ids == newer.block_ids[:2]
    cache.check_integrity()


def test_reading_a_tail_prices_it_with_its_node():
    cache, policy = trained_on_rewritten_tails()
    cls = tail_class(("new", 0, 2))
    fresh = cached(cache, seq(99000, 3))
    node = cache.tree.block_node[fresh.block_ids[0]]
    before = policy.reuse_probability(cls)
    assert cache.match(NS, seq(99000, 3) + [1]).block_ids == fresh.block_ids  # reads the tail
    assert node.tail_prio is None and node.evict_prio == node.prio
    assert policy.reuse_probability(cls) > before  # the read counts for the tail class
    cache.check_integrity()


def test_a_split_leaves_the_pending_tail_on_the_lower_part():
    cache, _ = trained_on_rewritten_tails()
    fresh = cached(cache, seq(99000, 3))
    cache.match(NS, seq(99000, 2))  # ends inside the node: splits it
    upper = cache.tree.block_node[fresh.block_ids[0]]
    lower = cache.tree.block_node[fresh.block_ids[2]]
    assert upper is not lower and lower.parent is upper
    assert upper.tail_prio is None and lower.tail_prio is not None
    assert evicted_order(cache, 1) == [fresh.block_ids[2]]
    cache.check_integrity()
