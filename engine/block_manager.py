"""The one engine-side owner of a KV block's life: match, load back from the spill tiers,
allocate (evicting and spilling when short), commit computed blocks to the tree, fork, release.

A sequence's table is [tree blocks | private blocks]:
  block_ids[:num_tree_blocks]  held by the radix tree, kept alive by locking `seq.handle`
  block_ids[num_tree_blocks:]  private (refcounted in the pool; shared only between forked samples)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.request import Sequence
from radixcache.hashing import block_hashes

if TYPE_CHECKING:
    from engine.kv_cache import KVCache
    from engine.kv_events import KVEventSink
    from engine.kv_tiers import KVTiers
    from radixcache.hashing import Namespace
    from radixcache.prefix_cache import PrefixCache
    from radixcache.results import EvictedBlock


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    """Prefix-caching variant: match at admission, insert full computed blocks after each step;
    with `tiers`, evicted blocks spill down and admission loads the following blocks back;
    with `events`, every block that enters or leaves the tree is published."""

    def __init__(
        self,
        cache: PrefixCache,
        kv_cache: KVCache,
        tiers: KVTiers | None = None,
        events: KVEventSink | None = None,
    ) -> None:
        self.cache = cache
        self.kv_cache = kv_cache
        self.tiers = tiers
        self.events = events
        self.block_size = cache.block_size

    # --- admission ---
    def admit(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Matches the cached prefix, locks it and allocates blocks for the first chunk.

        On failure nothing is held. `num_new_tokens` is the chunk the scheduler wants to run, counted
        from the end of the match (it is clipped by the caller after `match_len`)."""
        last_hash = self._match(seq)
        if self.tiers is not None and seq.num_computed_tokens < seq.num_tokens - 1:
            self._load_back(seq, last_hash, self.tiers)
        self._reuse_last_block(seq)
        needed = min(num_new_tokens, seq.num_tokens - seq.num_computed_tokens)
        if not self.allocate(seq, needed):
            self.release(seq)
            return False
        return True

    def peek(self, seq: Sequence) -> int:
        """Tokens of seq's prefix cached now (no stats, no lock); -1 when caching is off."""
        return self.cache.peek(seq.request.namespace, seq.token_ids[:-1]).num_tokens

    def _match(self, seq: Sequence) -> int | None:
        ns = seq.request.namespace
        match = self.cache.match(ns, seq.token_ids[:-1])
        self.cache.lock(match.handle)
        seq.handle = match.handle
        seq.block_ids = list(match.block_ids)
        seq.num_tree_blocks = len(match.block_ids)
        seq.num_computed_tokens = match.num_tokens
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = match.num_tokens
            seq.cached_by_tier = {"device": match.num_tokens}
        return match.last_hash

    def _reuse_last_block(self, seq: Sequence) -> None:
        """A sequence whose every block is cached (it ends on a block boundary, so the match of
        tokens[:-1] stopped one block short): copy the tree's last block into a private one and
        compute only the last token (for its logits) instead of the whole block again."""
        bs = self.block_size
        if seq.num_tokens % bs or seq.num_computed_tokens != seq.num_tokens - bs:
            return
        if self.cache.num_free_blocks() < 1:  # taking one must not evict the block to copy
            return
        full = self.cache.peek(seq.request.namespace, seq.token_ids)
        if full.num_tokens != seq.num_tokens:
            return
        (copy,) = self.cache.allocate(1)
        self.kv_cache.copy_block(full.block_ids[-1], copy)
        seq.block_ids.append(copy)
        seq.num_computed_tokens = seq.num_tokens - 1
        if seq.num_preemptions == 0:
            seq.num_cached_tokens += bs - 1
            seq.cached_by_tier["device"] = seq.cached_by_tier.get("device", 0) + bs - 1

    def _load_back(self, seq: Sequence, last_hash: int | None, tiers: KVTiers) -> None:
        """Loads the longest run of following full blocks of tokens[:-1] from the tiers into new
        device blocks and commits them to the tree like computed ones."""
        bs, start = self.block_size, seq.num_computed_tokens
        end = (seq.num_tokens - 1) // bs * bs
        if end <= start:
            return
        ns = seq.request.namespace
        hashes = block_hashes(ns, seq.token_ids[start:end], parent_hash=last_hash)
        loaded = tiers.load(ns, hashes)
        ids = self._take(len(loaded.blocks)) if loaded.blocks else None
        if not ids:
            return
        tiers.write(ids, loaded)
        seq.block_ids += ids
        seq.num_computed_tokens = start + len(ids) * bs
        self.commit(seq, publish=False)
        if seq.num_preemptions == 0:
            seq.num_cached_tokens += len(ids) * bs
            for name in loaded.tiers:
                seq.cached_by_tier[name] = seq.cached_by_tier.get(name, 0) + bs

    # --- growth ---
    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Ensures blocks for [0, num_computed + num_new_tokens); False (nothing changed) if short."""
        target = blocks_for(seq.num_computed_tokens + num_new_tokens, self.block_size)
        missing = target - len(seq.block_ids)
        if missing <= 0:
            return True
        new = self._take(missing)
        if new is None:
            return False
        seq.block_ids.extend(new)
        return True

    def _take(self, n: int) -> list[int] | None:
        """`n` free block ids; when short, LRU leaves are evicted first, spilled to the tiers and
        published as removed (with neither, `allocate` drops them: no hashes, no records)."""
        short = n - self.cache.num_free_blocks()
        if short > 0 and (self.tiers is not None or self.events is not None):
            if short > self.cache.num_evictable_blocks():
                return None
            self._spill_and_publish(self.cache.evict(short))
        return self.cache.allocate(n)

    def _spill_and_publish(self, evicted: list[EvictedBlock]) -> None:
        """Blocks that left the tree: spilled to the tiers, published as removed."""
        if self.tiers is not None:
            self.tiers.spill(evicted)
        if self.events is not None:
            self.events.blocks_evicted([b.block_hash for b in evicted])

    def lookup(self, ns: Namespace, tokens: list[int]) -> dict[str, int]:
        """Tokens of this prompt's prefix cached per tier, without running or locking it."""
        match = self.cache.peek(ns, tokens)
        found = {"device": match.num_tokens, "host": 0, "disk": 0, "redis": 0}
        bs, start = self.block_size, match.num_tokens
        end = len(tokens) // bs * bs
        if self.tiers is not None and end > start:
            hashes = block_hashes(ns, tokens[start:end], parent_hash=match.last_hash)
            found.update(self.tiers.lookup(ns, hashes))
        return found

    def flush(self, ns: Namespace | None) -> int:
        """Evicts every unreferenced cached block (of `ns`, or all), spilling it; blocks evicted."""
        evicted = self.cache.flush(ns)
        self._spill_and_publish(evicted)
        return len(evicted)

    def commit(self, seq: Sequence, publish: bool = True) -> None:
        """Hands newly full, computed blocks to the tree (dedup: switch to the tree's copy) and,
        with `publish`, to a write-through tier."""
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_tree_blocks:
            return
        ns = seq.request.namespace
        tokens = seq.token_ids[: num_full * self.block_size]
        # private blocks a forked sibling already handed to the tree: drop our ref after the insert
        adopted = [
            b for b in seq.block_ids[seq.num_tree_blocks : num_full] if self.cache.is_cached(b)
        ]
        before = seq.block_ids[:num_full]
        result = self.cache.insert(ns, tokens, before)
        mine = set(seq.block_ids[:num_full])
        duplicates = [b for b in result.duplicates if b in mine and b not in result.block_ids]
        if duplicates or adopted:
            self.cache.free(duplicates + adopted)
        seq.block_ids[:num_full] = result.block_ids
        self.cache.lock(result.handle)
        if seq.handle is not None:
            self.cache.unlock(seq.handle)
        seq.handle = result.handle
        hashes = None
        if publish and self.tiers is not None:
            new = slice(seq.num_tree_blocks, num_full)
            hashes = self.cache.hashes_of(result.handle)
            self.tiers.publish(ns, hashes[new], seq.block_ids[new])
        if self.events is not None:
            # ours the tree kept: not a sibling's copy it already had, not one handed over before
            kept = [
                i
                for i in range(seq.num_tree_blocks, num_full)
                if before[i] == result.block_ids[i] and before[i] not in adopted
            ]
            self.events.blocks_committed(
                kept, hashes or self.cache.hashes_of(result.handle), tokens
            )
        seq.num_tree_blocks = num_full

    # --- forking (parallel sampling) ---
    def fork(self, parent: Sequence, child: Sequence) -> bool:
        """Child shares the parent's KV: tree blocks by lock, private full blocks by refcount,
        and a partially filled last block by copy (copy-on-write: both would write into it next)."""
        num_full = parent.num_computed_tokens // self.block_size
        partial = len(parent.block_ids) > num_full
        copy = self._take(1) if partial else []
        if copy is None:
            return False
        if parent.handle is not None:
            self.cache.lock(parent.handle)
        shared_private = parent.block_ids[parent.num_tree_blocks : num_full]
        if shared_private:
            self.cache.incref(shared_private)
        if partial:
            self.kv_cache.copy_block(parent.block_ids[num_full], copy[0])
        child.handle = parent.handle
        child.block_ids = parent.block_ids[:num_full] + copy
        child.num_tree_blocks = parent.num_tree_blocks
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        child.cached_by_tier = dict(parent.cached_by_tier)
        return True

    # --- release ---
    def release(self, seq: Sequence) -> None:
        """Drops everything the sequence holds; its tree blocks stay cached (evictable)."""
        private = seq.block_ids[seq.num_tree_blocks :]
        if private:
            self.cache.free(private)
        if seq.handle is not None:
            self.cache.unlock(seq.handle)
        seq.handle = None
        seq.block_ids = []
        seq.num_tree_blocks = 0
        seq.num_computed_tokens = 0


class NoCacheBlockManager(BlockManager):
    """Prefix caching off: the PrefixCache is only the block allocator."""

    def peek(self, seq: Sequence) -> int:
        return -1

    def _match(self, seq: Sequence) -> int | None:
        seq.handle = None
        seq.block_ids = []
        seq.num_tree_blocks = 0
        seq.num_computed_tokens = 0
        return None

    def commit(self, seq: Sequence, publish: bool = True) -> None:
        return None
