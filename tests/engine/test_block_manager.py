"""BlockManager over a real PrefixCache: forked samples never leak or double-free blocks."""

from __future__ import annotations

import torch

from engine.block_manager import BlockManager
from engine.kv_cache import KVCache
from engine.request import Request, Sequence
from engine.sampling import SamplingParams
from radixcache.hashing import Namespace
from radixcache.prefix_cache import PrefixCache

BS = 4
NS = Namespace(model_id="m", kv_dtype="float32", block_size=BS)


def _seq(request: Request, index: int) -> Sequence:
    tokens = list(request.prompt_token_ids)
    return Sequence(request, index, tokens, len(tokens), None, detok=None)  # type: ignore[arg-type]


def test_fork_before_commit_shares_private_blocks_without_leaking():
    cache = PrefixCache(16, BS)
    manager = BlockManager(cache, KVCache(1, 16, BS, 1, 2, torch.float32))
    request = Request("r", None, list(range(10, 20)), SamplingParams(n=2), NS)
    parent, child = _seq(request, 0), _seq(request, 1)
    assert manager.admit(parent, parent.num_tokens)
    parent.num_computed_tokens = parent.num_tokens  # 10 tokens: 2 full blocks + a partial one
    assert manager.fork(parent, child)  # before the parent's full blocks reach the tree
    manager.commit(parent)
    manager.commit(child)
    assert child.block_ids[:2] == parent.block_ids[:2]
    cache.check_integrity()
    manager.release(parent)
    manager.release(child)
    cache.check_integrity()
    assert cache.num_free_blocks() + cache.num_evictable_blocks() == cache.num_blocks
    assert cache.num_evictable_blocks() == 2
