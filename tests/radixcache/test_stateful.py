"""Random operation sequences across namespaces; every invariant is checked after every step."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixcache import EvictedBlock, LRUPolicy, Namespace, PrefixCache
from radixcache.policy import FrequencyAgeingPolicy
from radixcache.policy_learned import LearnedReusePolicy

BS = 2
NAMESPACES = [Namespace("m", "float32", BS, cache_salt=s) for s in ("", "a", "b")]
tokens_st = st.lists(st.integers(0, 2), min_size=0, max_size=12)
ns_st = st.sampled_from(NAMESPACES)


class PrefixCacheMachine(RuleBasedStateMachine):
    policy_factory = LRUPolicy

    def __init__(self) -> None:
        super().__init__()
        self.cache = PrefixCache(
            20,
            BS,
            max_pinned_fraction=0.3,
            policy=self.policy_factory(),
            mrc_sample_rate=0.5,
        )
        self.held: list[tuple[object, list[int]]] = []  # locked handles and their blocks
        self.private: list[int] = []
        self.pins: list[tuple[Namespace, list[int]]] = []
        self.content: dict[int, tuple[Namespace, tuple[int, ...]]] = {}

    def _check_evicted(self, blocks: list[EvictedBlock]) -> None:
        locked = {b for _, ids in self.held for b in ids}
        pinned = {b for n in self.cache.tree.iter_nodes() if n.pin_ref > 0 for b in n.blocks}
        for e in blocks:
            assert e.block_id not in locked, "a locked block was evicted"
            assert e.block_id not in pinned, "a pinned block was evicted"
            ns, prefix = self.content[e.block_id]
            assert e.namespace == ns and tuple(e.tokens) == prefix[-BS:]

    def _check_blocks(self, ns: Namespace, tokens: list[int], block_ids: list[int]) -> None:
        for i, b in enumerate(block_ids):
            assert self.content[b] == (ns, tuple(tokens[: (i + 1) * BS])), "wrong block matched"

    @rule(ns=ns_st, tokens=tokens_st)
    def match_and_lock(self, ns: Namespace, tokens: list[int]) -> None:
        m = self.cache.match(ns, tokens)
        assert m.num_tokens == len(m.block_ids) * BS <= len(tokens)
        self._check_blocks(ns, tokens, m.block_ids)
        self.cache.lock(m.handle)
        self.held.append((m.handle, m.block_ids))

    @rule(ns=ns_st, tokens=tokens_st, keep_locked=st.booleans())
    def insert(self, ns: Namespace, tokens: list[int], keep_locked: bool) -> None:
        n = len(tokens) // BS
        short = n - self.cache.num_free_blocks()
        if 0 < short <= self.cache.num_evictable_blocks():  # as the engine does: spill, then take
            self._check_evicted(self.cache.evict(short))
        blocks = self.cache.allocate(n)
        if blocks is None:
            assert not self.cache.can_allocate(n)
            return
        for i, b in enumerate(blocks):
            self.content[b] = (ns, tuple(tokens[: (i + 1) * BS]))
        res = self.cache.insert(ns, tokens, blocks)
        self._check_blocks(ns, tokens, res.block_ids)
        self.cache.free(res.duplicates)
        if keep_locked:
            self.cache.lock(res.handle)
            self.held.append((res.handle, res.block_ids))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.held) - 1))
        handle, _ = self.held.pop(i)
        self.cache.unlock(handle)

    @rule(n=st.integers(0, 8))
    def evict(self, n: int) -> None:
        before = self.cache.num_evictable_blocks()
        evicted = self.cache.evict(n)
        self._check_evicted(evicted)
        assert len(evicted) == min(n, before)

    @rule(n=st.integers(1, 4))
    def allocate_private(self, n: int) -> None:
        blocks = self.cache.allocate(n)
        if blocks is not None:
            self.private += blocks

    @precondition(lambda self: self.private)
    @rule()
    def free_private(self) -> None:
        self.cache.free([self.private.pop()])

    @rule(ns=ns_st, tokens=tokens_st)
    def pin(self, ns: Namespace, tokens: list[int]) -> None:
        if self.cache.pin(ns, tokens):
            self.pins.append((ns, tokens))

    @precondition(lambda self: self.pins)
    @rule()
    def unpin(self) -> None:
        ns, tokens = self.pins.pop(0)
        assert self.cache.unpin(ns, tokens) > 0

    @rule(ns=st.one_of(st.none(), ns_st))
    def flush(self, ns: Namespace | None) -> None:
        self.cache.flush(ns)

    @invariant()
    def integrity(self) -> None:
        self.cache.check_integrity()
        for handle, ids in self.held:
            assert self.cache.match(handle.ns, self._tokens_of(handle)).block_ids[: len(ids)] == ids

    def _tokens_of(self, handle) -> list[int]:  # noqa: ANN001
        return [t for node in handle.path() for t in node.tokens]


PrefixCacheMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestPrefixCacheLRU = PrefixCacheMachine.TestCase


class FrequencyAgeingMachine(PrefixCacheMachine):
    policy_factory = FrequencyAgeingPolicy


FrequencyAgeingMachine.TestCase.settings = PrefixCacheMachine.TestCase.settings
TestPrefixCacheFrequencyAgeing = FrequencyAgeingMachine.TestCase


class LearnedReuseMachine(PrefixCacheMachine):
    policy_factory = LearnedReusePolicy


LearnedReuseMachine.TestCase.settings = PrefixCacheMachine.TestCase.settings
TestPrefixCacheLearnedReuse = LearnedReuseMachine.TestCase
