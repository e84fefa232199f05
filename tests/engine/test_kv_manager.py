"""KVCacheManager over a real PrefixCache: n > 1 siblings share the first one's prompt blocks as
cache hits (caching on, or off: then in a namespace of the request's own) and never leak."""

from __future__ import annotations

import pytest
import torch

from engine.kv import KVCacheManager, MatchState, NoPrefixCacheManager
from engine.kv.paged_cache import KVCache
from engine.request import Request, Sequence, SequenceStatus
from engine.sampling_params import SamplingParams
from radixcache.hashing import Namespace
from radixcache.prefix_cache import PrefixCache

BS = 4
NS = Namespace(model_id="m", kv_dtype="float32", block_size=BS)


def _seq(request: Request, index: int) -> Sequence:
    tokens = list(request.prompt_token_ids)
    seq = Sequence(request, index, tokens, len(tokens), None, detok=None)  # type: ignore[arg-type]
    request.seqs.append(seq)
    return seq


def _admit(manager: KVCacheManager, seq: Sequence) -> None:
    assert manager.match(seq) is MatchState.READY
    assert manager.allocate(seq, seq.num_tokens - seq.num_computed_tokens)


@pytest.mark.parametrize("caching", [True, False])
def test_siblings_share_the_first_ones_prompt_blocks_without_leaking(caching: bool) -> None:
    cache = PrefixCache(16, BS)
    kv = KVCache(1, 16, BS, 1, 2, torch.float32)
    manager = KVCacheManager(cache, kv) if caching else NoPrefixCacheManager(cache, kv)
    request = Request("r", None, list(range(10, 20)), SamplingParams(n=2), NS)
    first, sibling = _seq(request, 0), _seq(request, 1)
    _admit(manager, first)
    manager.computed(first, first.num_tokens)  # 10 tokens: 2 full blocks + a partial one
    _admit(manager, sibling)  # a cache hit of the first one's full blocks
    assert sibling.num_computed_tokens == 8 and sibling.block_ids[:2] == first.block_ids[:2]
    assert sibling.block_ids[2] != first.block_ids[2]  # each writes its own partial block
    manager.computed(sibling, sibling.num_tokens - sibling.num_computed_tokens)
    cache.check_integrity()
    for seq in (first, sibling):
        seq.status = SequenceStatus.FINISHED
        manager.free(seq)
    cache.check_integrity()
    assert cache.num_free_blocks() + cache.num_evictable_blocks() == cache.num_blocks
    assert cache.num_evictable_blocks() == (2 if caching else 0)  # caching off: flushed
    assert cache.stats().namespaces.keys() <= {NS}  # no namespace of the request is left


def test_computed_frees_a_rejected_drafts_blocks_and_commits_the_accepted_ones() -> None:
    cache = PrefixCache(16, BS)
    manager = KVCacheManager(cache, KVCache(1, 16, BS, 1, 2, torch.float32))
    request = Request("r", None, list(range(10, 17)), SamplingParams(), NS)
    seq = _seq(request, 0)
    _admit(manager, seq)
    manager.computed(seq, 7)  # the prompt's 7 tokens: one full block goes to the tree
    assert seq.num_tree_blocks == 1 and len(seq.block_ids) == 2
    seq.token_ids.append(17)  # sampled; a decode step runs it with a 6-token draft
    assert manager.reserve_draft(seq, 1, 6) == 6 and len(seq.block_ids) == 4
    seq.token_ids.extend([18, 19, 99])  # verified: 2 draft tokens accepted, then a correction
    manager.computed(seq, 1 + 2)  # [7, 10): the decoded token and the accepted ones
    assert seq.num_computed_tokens == 10 and len(seq.block_ids) == 3  # the 4th block is freed
    assert seq.num_tree_blocks == 2 and cache.num_free_blocks() == 16 - 3
    manager.check_integrity([seq])
    other = _seq(Request("o", None, list(range(10, 20)) + [5], SamplingParams(), NS), 0)
    assert manager.match(other) is MatchState.READY
    assert other.num_computed_tokens == 8  # the accepted tokens' block is a cache hit
    for s in (seq, other):
        manager.free(s)
    manager.check_integrity([])
    assert cache.num_free_blocks() + cache.num_evictable_blocks() == cache.num_blocks
