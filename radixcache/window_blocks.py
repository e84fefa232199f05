"""The sliding-window layers' KV blocks, beside the tree's full-attention ones.

A model whose windowed layers keep their own paged pool (engine/kv/hybrid_cache.py) has two
block ids per cached block of tokens: the full-attention block F, owned by the radix tree, and
its *twin* w in the window pool, holding the same tokens' KV for the windowed layers. A twin can
be evicted on its own while F stays cached (a tombstone: `twin[F] == 0`); it goes when F goes.

A hit that ends at block k needs, for its windowed layers, only the twins of the `needed` blocks
before k (the last W - 1 tokens' keys): `cut` shortens a match to where they are all present.
Window block 0 is the null block: a sequence's window table holds it where a block fell out of
its window (no kernel reads a block wholly before the window).

refs[w]: the sequences using w; owner[w]: the full block w is the twin of, or -1 (private to a
sequence). Free: no refs and no owner; evictable: an owner and no refs (oldest first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from radixcache.integrity import IntegrityError

NULL_BLOCK = 0


class WindowBlockError(ValueError):
    """A window block was used in a way its state does not allow."""


def blocks_before_hit(window: int, block_size: int) -> int:
    """Blocks before a hit point that a windowed layer reads: those holding the last W - 1
    tokens (the token at p attends keys [p - W + 1, p])."""
    return -(-(window - 1) // block_size)


@dataclass
class WindowStats:
    window: int  # tokens
    num_blocks: int  # usable blocks (the null block not counted)
    free: int
    evictable: int  # twins of cached blocks no sequence uses
    referenced: int  # blocks some sequence uses (twins or private)
    cached: int  # twins (evictable or referenced)
    tombstones: int  # cached full-attention blocks whose twin was evicted
    evicted: int  # twins evicted on their own (the full block stayed)
    lookups: int
    full_hit_tokens: int  # what the full-attention layers alone could have reused
    hit_tokens: int  # what the match kept once the windowed layers' blocks were asked for


class WindowBlocks:
    def __init__(self, num_blocks: int, num_full_blocks: int, block_size: int, window: int):
        """`num_blocks` usable window blocks (ids 1..num_blocks; 0 is the null block),
        `num_full_blocks` full-attention block ids the tree may own, `window` tokens."""
        if num_blocks < 1:
            raise ValueError("the window pool needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.window = window
        self.needed = blocks_before_hit(window, block_size)
        self.refs = [0] * (num_blocks + 1)
        self.owner = [-1] * (num_blocks + 1)
        self.twin = [NULL_BLOCK] * num_full_blocks
        self._free = list(range(num_blocks, 0, -1))
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self.num_cached = 0
        self.num_evicted = 0
        self.lookups = 0
        self.full_hit_tokens = 0
        self.hit_tokens = 0

    # --- occupancy ---
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return len(self._free) + len(self._evictable) >= n

    def allocate(self, n: int) -> list[int]:
        """Up to `n` free blocks (fewer if there are not as many), one reference each."""
        free = self._free
        n = min(n, len(free))
        ids = free[len(free) - n :]
        del free[len(free) - n :]
        for w in ids:
            self.refs[w] = 1
        return ids

    def evict(self, n: int) -> list[int]:
        """Frees the `n` (at most) oldest unused twins; their full blocks stay cached. Returns
        those full blocks."""
        lost = []
        for _ in range(min(n, len(self._evictable))):
            w, _ = self._evictable.popitem(last=False)
            f = self.owner[w]
            self.twin[f] = NULL_BLOCK
            self.owner[w] = -1
            self._free.append(w)
            lost.append(f)
        self.num_cached -= len(lost)
        self.num_evicted += len(lost)
        return lost

    # --- a sequence's references ---
    def hold(self, w: int) -> None:
        """One more sequence uses twin or block `w`."""
        if self.refs[w] == 0:
            if self.owner[w] < 0:
                raise WindowBlockError(f"window block {w} is free")
            del self._evictable[w]
        self.refs[w] += 1

    def release(self, ids: Iterable[int]) -> None:
        """Each id loses one reference (null entries are skipped): a private block becomes
        free, a twin becomes evictable (newest last)."""
        refs = self.refs
        for w in ids:
            if w == NULL_BLOCK:
                continue
            if refs[w] <= 0:
                raise WindowBlockError(f"window block {w} has no reference")
            refs[w] -= 1
            if refs[w] == 0:
                if self.owner[w] >= 0:
                    self._evictable[w] = None
                else:
                    self._free.append(w)

    # --- twins of the tree's blocks ---
    def twin_of(self, full_block: int) -> int:
        return self.twin[full_block]

    def adopt(self, full_block: int, w: int) -> None:
        """A sequence's private block `w` becomes the twin of cached block `full_block` (the
        sequence keeps its reference)."""
        if self.owner[w] >= 0 or self.refs[w] <= 0:
            raise WindowBlockError(f"window block {w} is not a private block")
        if self.twin[full_block] != NULL_BLOCK:
            raise WindowBlockError(f"block {full_block} already has a twin")
        self.owner[w] = full_block
        self.twin[full_block] = w
        self.num_cached += 1

    def drop(self, full_blocks: Iterable[int]) -> None:
        """The tree evicted these blocks: their twins (no sequence uses them) become free."""
        twin, owner = self.twin, self.owner
        for f in full_blocks:
            w = twin[f]
            if w == NULL_BLOCK:
                continue
            if self.refs[w]:
                raise WindowBlockError(f"twin {w} of evicted block {f} is in use")
            del self._evictable[w]
            twin[f] = NULL_BLOCK
            owner[w] = -1
            self._free.append(w)
            self.num_cached -= 1

    def cut(self, full_blocks: Sequence[int]) -> int:
        """The longest k <= len(full_blocks) such that the `needed` blocks before k (or all of
        them, if fewer) have twins: how much of a matched prefix the windowed layers can use."""
        twin, needed = self.twin, self.needed
        k = len(full_blocks)
        j = k - 1
        while j >= max(0, k - needed):
            if twin[full_blocks[j]] == NULL_BLOCK:
                k = j  # every end in (j, j + needed] reads block j: the next candidate is j
            j -= 1
        return k

    def record_match(self, full_tokens: int, kept_tokens: int) -> None:
        self.lookups += 1
        self.full_hit_tokens += full_tokens
        self.hit_tokens += kept_tokens

    # --- analytics and checks ---
    def stats(self) -> WindowStats:
        referenced = self.num_blocks - len(self._free) - len(self._evictable)
        tombstones = 0  # filled in by the prefix cache, which knows the tree's blocks
        return WindowStats(
            window=self.window,
            num_blocks=self.num_blocks,
            free=len(self._free),
            evictable=len(self._evictable),
            referenced=referenced,
            cached=self.num_cached,
            tombstones=tombstones,
            evicted=self.num_evicted,
            lookups=self.lookups,
            full_hit_tokens=self.full_hit_tokens,
            hit_tokens=self.hit_tokens,
        )

    def check_integrity(self, tree_blocks: set[int], held: dict[int, int] | None) -> None:
        """Every block is exactly one of free / evictable / referenced; twins and owners agree
        and belong to blocks the tree owns. `held`: each window block's references counted
        from the sequences' tables (None: not checked)."""
        free = set(self._free)
        if len(free) != len(self._free) or NULL_BLOCK in free:
            raise IntegrityError("the window free list repeats a block or holds the null block")
        for w in range(1, self.num_blocks + 1):
            refs, owner = self.refs[w], self.owner[w]
            states = (w in free, w in self._evictable, refs > 0)
            if sum(states) != 1:
                raise IntegrityError(f"window block {w} is in {sum(states)} states")
            if refs < 0 or (w in self._evictable and owner < 0):
                raise IntegrityError(f"window block {w}: refs {refs}, owner {owner}")
            if owner >= 0 and (self.twin[owner] != w or owner not in tree_blocks):
                raise IntegrityError(f"window block {w} is the twin of uncached block {owner}")
            if held is not None and held.get(w, 0) != refs:
                raise IntegrityError(f"window block {w}: {refs} refs, {held.get(w, 0)} held")
        twins = [f for f, w in enumerate(self.twin) if w != NULL_BLOCK]
        if len(twins) != self.num_cached or any(self.owner[self.twin[f]] != f for f in twins):
            raise IntegrityError("twin table and owners disagree")
