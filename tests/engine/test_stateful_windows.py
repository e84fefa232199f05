"""Random operation sequences on the KV cache manager of a hybrid cache (a full-attention layer
and a windowed one, each in its own pool): admissions that hit cached prefixes, chunks and
decode steps, drafts that are rejected, finished sequences, eviction of full blocks and of
windowed twins on their own. After every step: the cache's and the window pool's invariants
against the sequences' tables, and every block a sequence reads holds the KV of its own tokens
(each block is stamped with a fingerprint of the tokens up to its end, in both pools)."""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.kv import KVCacheManager, MatchState
from engine.kv.hybrid_cache import HybridKVCache, KVGroups, WindowBudget
from engine.request import Request, Sequence
from engine.sampling_params import SamplingParams
from radixcache.hashing import Namespace
from radixcache.prefix_cache import PrefixCache
from radixcache.window_blocks import NULL_BLOCK, WindowBlocks

BS, WINDOW = 2, 6  # a hit reads the 3 blocks before it in the windowed layer
NAMESPACES = [Namespace("m", "float32", BS, cache_salt=s) for s in ("", "a")]
# prompts that share heads of two long texts, cut anywhere, with a few tokens of their own
HEADS = [[3, 4, 5, 3, 4, 4, 5, 3, 3, 5, 4, 3, 5, 5, 4, 3], [5, 5, 4, 3, 4, 3, 5, 4, 4, 3, 3, 5]]
tokens_st = st.builds(
    lambda head, cut, tail: head[:cut] + tail,
    st.sampled_from(HEADS),
    st.integers(0, 16),
    st.lists(st.integers(3, 5), max_size=4),
).filter(lambda t: len(t) >= 2)


def fingerprint(ns: Namespace, tokens) -> float:  # noqa: ANN001
    return float(hash((ns.cache_salt, tuple(tokens))) % 1_000_003)


class HybridManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        groups = KVGroups(full_layers=(0,), window_layers=(1,), window=WINDOW)
        self.kv = HybridKVCache(groups, WindowBudget(24, 10), BS, 1, 1, torch.float32)
        self.windows = WindowBlocks(10, 24, BS, WINDOW)
        self.cache = PrefixCache(24, BS, windows=self.windows)
        self.manager = KVCacheManager(self.cache, self.kv)
        self.live: list[Sequence] = []
        self.n = 0

    # --- what a forward pass would do: stamp the blocks that became full ---
    def _compute(self, seq: Sequence, n: int) -> None:
        ns = seq.request.namespace
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
        for j in range(start // BS, end // BS):
            value = fingerprint(ns, seq.token_ids[: (j + 1) * BS])
            self.kv.tensor[:, :, seq.block_ids[j]] = value
            assert seq.window_block_ids[j] != NULL_BLOCK, "a computed block has no window block"
            self.kv.window_tensor[:, :, seq.window_block_ids[j]] = value
        self.manager.computed(seq, n)

    def _check_reads(self, seq: Sequence) -> None:
        """The full blocks of seq's computed prefix and the window blocks its next token reads
        hold its own tokens' KV."""
        ns, nc = seq.request.namespace, seq.num_computed_tokens
        first_read = max(0, (nc - WINDOW + 1) // BS)
        for j in range(nc // BS):
            want = fingerprint(ns, seq.token_ids[: (j + 1) * BS])
            assert float(self.kv.tensor[0, 0, seq.block_ids[j], 0, 0]) == want
            w = seq.window_block_ids[j]
            if j >= first_read:
                assert w != NULL_BLOCK, f"block {j} of the window was let go"
                assert float(self.kv.window_tensor[0, 0, w, 0, 0]) == want
            else:
                assert w == NULL_BLOCK, f"block {j}, out of the window, is still held"

    @rule(ns=st.sampled_from(NAMESPACES), tokens=tokens_st, chunk=st.integers(1, 8))
    def admit(self, ns: Namespace, tokens: list[int], chunk: int) -> None:
        self.n += 1
        request = Request(f"r{self.n}", None, tokens, SamplingParams(), ns)
        seq = Sequence(request, 0, list(tokens), len(tokens), None, detok=None)  # type: ignore[arg-type]
        request.seqs.append(seq)
        assert self.manager.match(seq) is MatchState.READY
        self._check_reads(seq)
        n = min(chunk, seq.num_tokens - seq.num_computed_tokens)
        if not self.manager.allocate(seq, n):
            self.manager.free(seq)
            return
        self.live.append(seq)
        self._compute(seq, n)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), chunk=st.integers(1, 8), token=st.integers(3, 5))
    def step(self, data: st.DataObject, chunk: int, token: int) -> None:
        seq = self.live[data.draw(st.integers(0, len(self.live) - 1))]
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(token)  # a decode step: the sampled token's KV is computed next
        n = min(chunk, seq.num_tokens - seq.num_computed_tokens)
        if self.manager.allocate(seq, n):
            self._compute(seq, n)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), k=st.integers(1, 6))
    def rejected_draft(self, data: st.DataObject, k: int) -> None:
        seq = self.live[data.draw(st.integers(0, len(self.live) - 1))]
        self.manager.reserve_draft(seq, seq.num_tokens - seq.num_computed_tokens, k)
        assert len(seq.window_block_ids) == len(seq.block_ids)
        self.manager.computed(seq, 0)  # the draft was rejected: its blocks go

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        seq = self.live.pop(data.draw(st.integers(0, len(self.live) - 1)))
        self.manager.free(seq)

    @rule(n=st.integers(1, 6))
    def evict_full_blocks(self, n: int) -> None:
        self.cache.evict(n)  # (the manager has no listeners to hand them to)

    @rule(n=st.integers(1, 6))
    def evict_twins(self, n: int) -> None:
        self.windows.evict(n)

    @invariant()
    def integrity(self) -> None:
        self.manager.check_integrity(self.live)
        for seq in self.live:
            self._check_reads(seq)
        for f, w in enumerate(self.windows.twin):
            if w != NULL_BLOCK:
                assert torch.equal(self.kv.window_tensor[:, :, w], self.kv.tensor[:, :, f])


HybridManagerMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None
)
TestHybridManager = HybridManagerMachine.TestCase
