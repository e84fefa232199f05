"""KVCacheManager: the scheduler's one way to the KV blocks. Its verbs:

  match(seq)         lock seq's cached device prefix; READY, or LOADING while the spill tiers
                     bring back the blocks after it (the scheduler parks the sequence meanwhile)
  load_ready(seq)    its load is done or past its deadline: match it again (each match copies a
                     part of the blocks in while others decode; READY once all are in)
  step_started(d)    each step: paces the loader while sequences decode
  can_fit(n)         n more blocks can be had (free + evictable)
  allocate(seq, n)   blocks for n more tokens, evicting when short
  reserve_draft(seq, n)  free blocks only (no eviction) for up to n draft tokens after the chunk
  draft_within_own_block(seq, draft)  how many draft tokens to verify (see there)
  lookahead(seq, k)  up to k cached tokens continuing seq's (drafts from the tree)
  computed(seq, n)   after a step: n more tokens' KV is computed; frees the blocks past seq's
                     tokens (a rejected draft's) and hands newly full blocks to the tree; once
                     a retained request's prompt is in, its full blocks go to the persistent tier
  free(seq)          drop everything seq holds (its tree blocks stay cached)

and for administration and analytics (engine/kv/admin.py, engine/analytics.py):

  lookup(ns, tokens) tokens of a prompt's prefix cached per tier (nothing locked)
  pin / unpin        keep a cached prefix from eviction, and let it go again
  hottest_prefixes   the most-hit cached prefixes
  flush(ns)          evict every unreferenced block (through the listeners)
  stats()            the device pool's counters; tier_stats(): the spill tiers'
  check_integrity    the cache's invariants
  close()            finish tier writes, stop the tier and event threads, free the KV pools

The prefix cache picks eviction victims when an allocation is short; the manager decides where
they go: to the listeners (the spill tiers, the KV events), or nowhere when there are none.

A sequence's table is [tree blocks | private blocks]:
  block_ids[:num_tree_blocks]  held by the radix tree, kept alive by locking `seq.handle`
  block_ids[num_tree_blocks:]  private to the sequence (one reference each in the pool)

A hybrid KV cache (sliding-window layers in a pool of their own, engine/kv/hybrid_cache.py) adds
a second table, `seq.window_block_ids`, the same length: the windowed layers' block of each token
block. A match is cut to where the windowed layers have the blocks they read (the last W - 1
tokens before the hit); after each commit the blocks that fell out of the sequence's window are
let go (a cached block's windowed twin stays cached, evictable on its own: radixcache's
WindowBlocks); growth takes a block in each pool.

Prefix caching off is its own class (engine/kv/no_cache.py).
"""

from __future__ import annotations

import time
from array import array
from collections import Counter
from enum import Enum
from typing import TYPE_CHECKING

from engine.kv.listeners import CacheListener, Committed
from engine.request import Sequence
from radixcache.hashing import block_hashes
from radixcache.integrity import IntegrityError
from radixcache.shared.tier_names import SPILL_TIERS, TierName
from radixcache.window_blocks import NULL_BLOCK

if TYPE_CHECKING:
    from collections.abc import Sequence as Tokens

    from engine.kv.events import ZmqEventPublisher
    from engine.kv.paged_cache import KVCache
    from engine.kv.tiers import KVTiers, TierLoad
    from radixcache.hashing import Namespace
    from radixcache.prefix_cache import PrefixCache
    from radixcache.results import EvictedBlock, MatchResult
    from radixcache.stats import CacheStats, PrefixInfo
    from radixcache.window_blocks import WindowBlocks
    from storage.store_stats import StoreSnapshot


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class MatchState(Enum):
    READY = "ready"  # the cached prefix is locked; allocate the first chunk
    LOADING = "loading"  # blocks are coming from a spill tier; ask load_ready before admitting


class KVCacheManager:
    def __init__(
        self,
        cache: PrefixCache,
        kv_cache: KVCache,
        *,
        tiers: KVTiers | None = None,
        listeners: tuple[CacheListener, ...] = (),
        publisher: ZmqEventPublisher | None = None,
        release_window_blocks: bool = True,
    ) -> None:
        """`publisher`: the KV-events publisher behind one of the listeners (closed with the
        manager). `release_window_blocks`: let go of a sequence's windowed-layer blocks that
        fell out of its window (a hybrid cache; off only to measure what releasing saves)."""
        self.cache = cache
        self.windows: WindowBlocks | None = cache.windows
        self.release_window_blocks = release_window_blocks
        self.kv_cache = kv_cache
        self.tiers = tiers
        self.listeners = listeners
        self.publisher = publisher
        self.block_size = cache.block_size
        self.num_blocks = cache.num_blocks

    # --- admission ---
    def match(self, seq: Sequence, decoding: bool = False) -> MatchState:
        """Locks seq's cached prefix (on the device, or loaded back for it). LOADING: a load from
        the spill tiers started, or the blocks it brought are still being copied in (a part per
        call while others are `decoding`); the sequence holds its device prefix until it is
        matched again."""
        if seq.kv_load is not None:
            if not self._install(seq, seq.kv_load, decoding):
                return MatchState.LOADING
            self._reuse_last_block(seq)
        else:
            last_hash = self._match_device(seq)
            self._reuse_last_block(seq)  # the device has every block: nothing to load
            if self.tiers is not None and self._start_load(seq, last_hash, self.tiers):
                return MatchState.LOADING
        if self.windows is not None and self.release_window_blocks:
            self._release_out_of_window(seq, self.windows)
        return MatchState.READY

    def step_started(self, decoding: bool) -> None:
        """Each step: `decoding` (sequences are running) lets loads go at their paced speed."""
        if self.tiers is not None:
            self.tiers.step_started(decoding)

    def load_ready(self, seq: Sequence, now: float) -> bool:
        """seq's load is done or past its deadline: match it again to put its blocks in."""
        return seq.kv_load is None or seq.kv_load.pending.ready(now)

    def wait_for_load(self, seq: Sequence, timeout: float) -> None:
        """Blocks until seq's load is done, at most `timeout` (only when nothing else can run)."""
        load = seq.kv_load
        if load is not None and load.arrived is None:
            deadline = load.pending.deadline
            load.pending.wait(min(timeout, max(0.0, deadline - time.monotonic())))

    def peek(self, seq: Sequence) -> int:
        """Tokens of seq's prefix cached on the device now (no stats, no lock); -1 when the
        sequence has nothing to share (caching off, one sample)."""
        if not self._shares(seq):
            return -1
        return self.cache.peek(self._ns(seq), seq.token_ids[:-1]).num_tokens

    def can_fit(self, num_blocks: int) -> bool:
        windows = self.windows
        fits = windows is None or windows.can_allocate(num_blocks)
        return fits and self.cache.can_allocate(num_blocks)

    def _match_device(self, seq: Sequence) -> int | None:
        if not self._shares(seq):
            seq.handle, seq.block_ids, seq.num_tree_blocks, seq.num_computed_tokens = None, [], 0, 0
            seq.window_block_ids, seq.num_window_released = [], 0
            return None
        match = self._lookup(self._ns(seq), seq.token_ids[:-1])
        self.cache.lock(match.handle)
        seq.handle = match.handle
        seq.block_ids = list(match.block_ids)
        seq.num_tree_blocks = len(match.block_ids)
        seq.num_computed_tokens = match.num_tokens
        if self.windows is not None:
            self._hold_twins(seq, self.windows)
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = match.num_tokens
            seq.cached_by_tier = {TierName.DEVICE: match.num_tokens}
        return match.last_hash

    def _lookup(self, ns: Namespace, tokens: array) -> MatchResult:
        """The tree's match of `tokens`; with windowed layers, cut to where their blocks are."""
        windows = self.windows
        if windows is None:
            return self.cache.match(ns, tokens)
        full = self.cache.peek(ns, tokens)
        keep = windows.cut(full.block_ids)
        windows.record_match(full.num_tokens, keep * self.block_size)
        return self.cache.match(ns, tokens[: keep * self.block_size])

    def _hold_twins(self, seq: Sequence, windows: WindowBlocks) -> None:
        """seq's window table over its matched blocks: the twins its window reads, held."""
        first = max(0, seq.num_tree_blocks - windows.needed)
        table = [NULL_BLOCK] * first
        for f in seq.block_ids[first:]:
            w = windows.twin_of(f)
            windows.hold(w)
            table.append(w)
        seq.window_block_ids, seq.num_window_released = table, first

    def _start_load(self, seq: Sequence, last_hash: int | None, tiers: KVTiers) -> bool:
        """Starts loading the full blocks after the device match (the last one too where the
        prompt ends on a block boundary: its last token is then recomputed in a private copy, as
        _reuse_last_block does on the device); False when there are none to ask for."""
        bs, start = self.block_size, len(seq.block_ids) * self.block_size
        end = seq.num_tokens // bs * bs
        if end <= start:
            return False
        ns = self._ns(seq)
        hashes = block_hashes(ns, seq.token_ids[start:end], parent_hash=last_hash)
        seq.kv_load = tiers.start_load(ns, hashes)
        return True

    def _place(self, seq: Sequence, load: TierLoad) -> None:
        """Device blocks for what a finished (or expired) load brought, held by seq (beyond its
        computed tokens) until installed; none when nothing came or there is no room."""
        load.arrived = loaded = load.pending.take()
        n, windows = len(loaded.blocks), self.windows
        if n == 0 or not self.cache.can_allocate(n):
            return
        if windows is not None:  # only the blocks the window of the next token reads
            read = min(n, windows.needed)
            if not windows.can_allocate(read):
                return
            tail = self._take_window(windows, read)
            load.window_ids = [NULL_BLOCK] * (n - len(tail)) + tail
            seq.window_block_ids += load.window_ids
        ids = self._take(n)
        assert ids is not None  # can_allocate said so
        load.block_ids = ids
        seq.block_ids += ids

    def _install(self, seq: Sequence, load: TierLoad, decoding: bool) -> bool:
        """Copies the next part of what seq's load brought into its device blocks; once all is
        in (True), commits them to the tree like computed ones. What did not come is recomputed."""
        assert self.tiers is not None
        if load.arrived is None:
            self._place(seq, load)
        self.tiers.write_some(load, decoding)
        if not load.installed:
            return False
        seq.kv_load = None
        if not load.block_ids:
            return True
        bs, before = self.block_size, seq.num_computed_tokens
        # the last token is always computed (its logits): a block ending there stays private
        # until that step fills it again, then it is committed like any other
        seq.num_computed_tokens = min(before + len(load.block_ids) * bs, seq.num_tokens - 1)
        self._commit(seq, loaded=True)
        if self.windows is not None and self.release_window_blocks:
            self._release_out_of_window(seq, self.windows)
        if seq.num_preemptions == 0:
            assert load.arrived is not None
            gained = seq.num_computed_tokens - before
            seq.num_cached_tokens += gained
            for i, name in enumerate(load.arrived.tiers):  # the last block: maybe bs - 1
                seq.cached_by_tier[name] = seq.cached_by_tier.get(name, 0) + min(
                    bs, gained - i * bs
                )
        return True

    def _reuse_last_block(self, seq: Sequence) -> None:
        """A sequence whose every block is cached (it ends on a block boundary, so the match of
        tokens[:-1] stopped one block short): copy the tree's last block into a private one and
        compute only the last token (for its logits) instead of the whole block again."""
        bs = self.block_size
        if seq.num_tokens % bs or seq.num_computed_tokens != seq.num_tokens - bs:
            return
        if self.cache.num_free_blocks() < 1:  # taking one must not evict the block to copy
            return
        full = self.cache.peek(self._ns(seq), seq.token_ids)
        if full.num_tokens != seq.num_tokens:
            return
        windows, last = self.windows, full.block_ids[-1]
        if windows is not None:
            twin = windows.twin_of(last)
            if twin == NULL_BLOCK or windows.num_free() < 1:
                return
            (window_copy,) = windows.allocate(1)
            self.kv_cache.copy_window_block(twin, window_copy)  # type: ignore[attr-defined]
            seq.window_block_ids.append(window_copy)
        (copy,) = self.cache.allocate(1)
        self.kv_cache.copy_block(last, copy)
        seq.block_ids.append(copy)
        seq.num_computed_tokens = seq.num_tokens - 1
        if seq.num_preemptions == 0:
            seq.num_cached_tokens += bs - 1
            device = seq.cached_by_tier.get(TierName.DEVICE, 0)
            seq.cached_by_tier[TierName.DEVICE] = device + bs - 1

    # --- growth ---
    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Ensures blocks for [0, num_computed + num_new_tokens); False (nothing changed) if short."""
        target = blocks_for(seq.num_computed_tokens + num_new_tokens, self.block_size)
        missing = target - len(seq.block_ids)
        if missing <= 0:
            return True
        windows = self.windows
        if windows is not None and not windows.can_allocate(missing):
            return False
        new = self._take(missing)
        if new is None:
            return False
        seq.block_ids.extend(new)
        if windows is not None:
            seq.window_block_ids += self._take_window(windows, missing)
        return True

    def reserve_draft(self, seq: Sequence, num_scheduled: int, num_draft: int) -> int:
        """Blocks for up to num_draft draft tokens after seq's scheduled chunk, from free blocks
        only (a draft never evicts a cached block); the draft tokens they have room for."""
        bs = self.block_size
        end = seq.num_computed_tokens + num_scheduled
        have = len(seq.block_ids)
        want = blocks_for(end + num_draft, bs) - have
        if want > 0:
            n = min(want, self.cache.num_free_blocks())
            if self.windows is not None:
                n = min(n, self.windows.num_free())
                seq.window_block_ids += self.windows.allocate(n)
            seq.block_ids.extend(self.cache.allocate(n) or [])
        return max(0, min(num_draft, len(seq.block_ids) * bs - end))

    def draft_within_own_block(self, seq: Sequence, draft: list[int]) -> int:
        """How many of a decoding seq's draft tokens to verify: all, unless their rows would run
        past the end of its current block and the tree already holds that block. Committing it
        then switches seq to the tree's copy, whose bits may differ (another prefill chunking),
        so the rows past it would attend seq's own copy where plain decoding, one step later,
        attends the tree's: cut there, greedy output stays the same with and without drafts."""
        bs, last = self.block_size, seq.num_tokens - 1  # the row of seq's last token
        start = last // bs * bs
        room = start + bs - 1 - last  # draft tokens whose rows stay in the block
        if len(draft) <= room or not self._shares(seq):
            return len(draft)
        if seq.num_tree_blocks * bs != start:  # not committed up to its block: nothing switches
            return len(draft)
        block = seq.token_ids[start : last + 1]
        block.extend(draft[:room])
        if self.cache.holds_next_block(self._ns(seq), seq.handle, block):
            return room
        return len(draft)

    def lookahead(self, seq: Sequence, limit: int) -> list[int]:
        """Up to `limit` cached tokens that continue seq's tokens (drafts for speculative
        decoding); nothing is locked or touched."""
        # [0, committed): the locked tree path (ends at seq.handle); [committed, num_tokens): tail
        committed = seq.num_tree_blocks * self.block_size
        tail = seq.token_ids[committed:]
        return self.cache.lookahead(self._ns(seq), seq.handle, tail, limit)

    def _trim(self, seq: Sequence) -> None:
        """Frees the private blocks past what seq's tokens need (a rejected draft's slots)."""
        keep = max(blocks_for(seq.num_tokens, self.block_size), seq.num_tree_blocks)
        if len(seq.block_ids) > keep:
            self.cache.free(seq.block_ids[keep:])
            del seq.block_ids[keep:]
        if self.windows is not None and len(seq.window_block_ids) > keep:
            self.windows.release(seq.window_block_ids[keep:])
            del seq.window_block_ids[keep:]

    def _take(self, n: int) -> list[int] | None:
        """`n` block ids; when the free list is short, the cache evicts the policy's victims
        and they go to the listeners (with none, they are dropped: no hashes, no records)."""
        return self.cache.allocate(n, self._evicted if self.listeners else None)

    def _take_window(self, windows: WindowBlocks, n: int) -> list[int]:
        """`n` window blocks (the caller checked they can be had), evicting the oldest unused
        twins first when short; the listeners hear which cached blocks lost theirs."""
        short = n - windows.num_free()
        if short > 0:
            lost = windows.evict(short)
            if self.listeners:
                hashes = self.cache.block_hashes_of(lost)
                for listener in self.listeners:
                    listener.twins_evicted(hashes)
        return windows.allocate(n)

    def _evicted(self, evicted: list[EvictedBlock]) -> None:
        for listener in self.listeners:
            listener.blocks_evicted(evicted)

    def flush(self, ns: Namespace | None) -> int:
        """Evicts every unreferenced cached block (of `ns`, or all), through the listeners."""
        evicted = self.cache.flush(ns)
        if evicted:
            self._evicted(evicted)
        return len(evicted)

    # --- after a step ---
    def computed(self, seq: Sequence, num_tokens: int) -> None:
        """The step computed the KV of seq's tokens [num_computed, num_computed + num_tokens)
        (after a verified draft: the decoded token and the accepted draft tokens). The private
        blocks past what seq's tokens need (a rejected draft's) are freed, newly full blocks
        go to the tree (dedup: seq switches to the tree's copy), and window blocks that fell
        out of seq's window are let go."""
        before = seq.num_computed_tokens
        seq.num_computed_tokens += num_tokens
        self._trim(seq)
        if self._shares(seq):
            self._commit(seq, loaded=False)
        if before < seq.num_prompt_tokens <= seq.num_computed_tokens:  # the prompt is in
            self._retain(seq)
        if self.windows is not None and self.release_window_blocks:
            self._release_out_of_window(seq, self.windows)

    def _retain(self, seq: Sequence) -> None:
        """A retained request's prompt blocks, device hits included, are all in the tree now:
        hand them to the persistent tier (once per request: its first sample; again after a
        preemption, which renews the retention)."""
        if not seq.request.retain_prefix or seq.index != 0 or self.tiers is None:
            return
        n = seq.num_prompt_tokens // self.block_size
        if n == 0 or seq.handle is None:
            return
        assert seq.num_tree_blocks >= n
        hashes = self.cache.hashes_of(seq.handle)[:n]
        self.tiers.retain(self._ns(seq), hashes, seq.block_ids[:n])

    def _release_out_of_window(self, seq: Sequence, windows: WindowBlocks) -> None:
        """Lets go of the window blocks wholly before the window of seq's next token (at
        num_computed_tokens, it reads keys from num_computed_tokens - W + 1 on)."""
        end = (seq.num_computed_tokens - windows.window + 1) // self.block_size
        start = seq.num_window_released
        if end > start:
            table = seq.window_block_ids
            windows.release(table[start:end])
            table[start:end] = [NULL_BLOCK] * (end - start)
            seq.num_window_released = end

    def _commit(self, seq: Sequence, loaded: bool) -> None:
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_tree_blocks:
            return
        ns = self._ns(seq)
        tokens = seq.token_ids[: num_full * self.block_size]
        before = seq.block_ids[:num_full]
        result = self.cache.insert(ns, tokens, before)
        mine = set(before)
        duplicates = [b for b in result.duplicates if b in mine and b not in result.block_ids]
        if duplicates:
            self.cache.free(duplicates)
        seq.block_ids[:num_full] = result.block_ids
        if self.windows is not None:
            self._commit_twins(seq, self.windows, num_full)
        self.cache.lock(result.handle)
        if seq.handle is not None:
            self.cache.unlock(seq.handle)
        seq.handle = result.handle
        if self.listeners:
            new = range(seq.num_tree_blocks, num_full)
            kept = [i for i in new if before[i] == result.block_ids[i]]
            committed = Committed(
                ns,
                self.cache.hashes_of(result.handle),
                seq.block_ids[:num_full],
                tokens,
                new,
                kept,
                loaded,
            )
            for listener in self.listeners:
                listener.blocks_committed(committed)
        seq.num_tree_blocks = num_full

    def _commit_twins(self, seq: Sequence, windows: WindowBlocks, num_full: int) -> None:
        """The newly committed blocks' window blocks become their twins; where the tree's block
        already has one, seq switches to it and lets its own copy go."""
        table = seq.window_block_ids
        for i in range(seq.num_tree_blocks, num_full):
            f, w = seq.block_ids[i], table[i]
            if w == NULL_BLOCK:
                continue
            twin = windows.twin_of(f)
            if twin == NULL_BLOCK:
                windows.adopt(f, w)
            elif twin != w:
                windows.hold(twin)
                windows.release((w,))
                table[i] = twin

    # --- release ---
    def free(self, seq: Sequence) -> None:
        """Drops everything the sequence holds; its tree blocks stay cached (evictable)."""
        if seq.kv_load is not None:
            seq.kv_load.pending.cancel()
            seq.kv_load = None
        private = seq.block_ids[seq.num_tree_blocks :]
        if private:
            self.cache.free(private)
        if self.windows is not None:
            self.windows.release(seq.window_block_ids)
            seq.window_block_ids, seq.num_window_released = [], 0
        if seq.handle is not None:
            self.cache.unlock(seq.handle)
        seq.handle = None
        seq.block_ids = []
        seq.num_tree_blocks = 0
        seq.num_computed_tokens = 0

    # --- administration and analytics ---
    def lookup(self, ns: Namespace, token_ids: Tokens[int]) -> dict[str, int]:
        """Tokens of this prompt's prefix cached per tier, without running or locking it."""
        match = self.cache.peek(ns, token_ids)
        found = {TierName.DEVICE: match.num_tokens, **dict.fromkeys(SPILL_TIERS, 0)}
        bs, start = self.block_size, match.num_tokens
        end = len(token_ids) // bs * bs
        if self.tiers is not None and end > start:
            hashes = block_hashes(ns, token_ids[start:end], parent_hash=match.last_hash)
            found.update(self.tiers.lookup(ns, hashes))
        return found

    def pin(self, ns: Namespace, token_ids: Tokens[int]) -> int:
        """Pins the cached prefix of `token_ids` (capped by the cache); tokens pinned."""
        return self.cache.pin(ns, token_ids)

    def unpin(self, ns: Namespace, token_ids: Tokens[int]) -> int:
        """Undoes one earlier pin of the same tokens; tokens unpinned."""
        return self.cache.unpin(ns, token_ids)

    def hottest_prefixes(self, limit: int, ns: Namespace | None) -> list[PrefixInfo]:
        """The most-hit cached prefixes (of `ns`, or all)."""
        return self.cache.hottest_prefixes(limit, ns)

    def stats(self) -> CacheStats:
        """The device pool's occupancy and per-namespace counters."""
        return self.cache.stats()

    @property
    def can_retain(self) -> bool:
        """Whether prefixes can be retained: a persistent tier (disk or Redis) below."""
        return self.tiers is not None and self.tiers.store.can_retain

    def tier_stats(self) -> StoreSnapshot | None:
        """The spill tiers' counters; None without tiers."""
        return None if self.tiers is None else self.tiers.store.stats()

    def close(self) -> None:
        """Finishes queued tier writes, stops the tier and event threads and frees the KV pools
        (nothing can use the cache after this)."""
        if self.tiers is not None:
            self.tiers.close()
        if self.publisher is not None:
            self.publisher.close()
        self.kv_cache.release()

    def check_integrity(self, holders: list[Sequence]) -> None:
        """The cache's invariants; with windowed layers also every window block's references
        against the tables of `holders` (the sequences that hold blocks)."""
        refs = None
        if self.windows is not None:
            refs = Counter(w for s in holders for w in s.window_block_ids if w != NULL_BLOCK)
            for s in holders:
                if len(s.window_block_ids) != len(s.block_ids):
                    raise IntegrityError(f"sequence {s.seq_id}: tables of unequal length")
        self.cache.check_integrity(refs)

    def _shares(self, seq: Sequence) -> bool:
        """Whether seq's blocks go through the tree (always, with prefix caching on)."""
        return True

    def _ns(self, seq: Sequence) -> Namespace:
        return seq.request.namespace
