"""Prefix caching off: nothing is shared between requests, but one request's n > 1 siblings
still share its prompt through the tree, in a namespace private to the request that is flushed
when its last sibling lets go. No spill tiers, no KV events."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.kv.manager import KVCacheManager
from engine.request import Sequence

if TYPE_CHECKING:
    from engine.kv.paged_cache import KVCache
    from radixcache.hashing import Namespace
    from radixcache.prefix_cache import PrefixCache


class NoPrefixCacheManager(KVCacheManager):
    def __init__(
        self, cache: PrefixCache, kv_cache: KVCache, release_window_blocks: bool = True
    ) -> None:
        super().__init__(cache, kv_cache, release_window_blocks=release_window_blocks)

    def free(self, seq: Sequence) -> None:
        super().free(seq)
        siblings = seq.request.seqs
        if seq.params.n > 1 and all(
            (s.is_finished or s is seq) and s.handle is None for s in siblings
        ):
            ns = self._ns(seq)
            self.cache.flush(ns)
            self.cache.forget(ns)

    def lookahead(self, seq: Sequence, limit: int) -> list[int]:
        """Nothing is shared between requests: the tree offers no drafts."""
        return []

    def _shares(self, seq: Sequence) -> bool:
        return seq.params.n > 1

    def _ns(self, seq: Sequence) -> Namespace:
        ns = seq.request.namespace
        return ns.with_salt(f"{ns.cache_salt}\0siblings:{seq.request.request_id}")
