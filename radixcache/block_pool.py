"""Refcounted block ids 0..num_blocks-1 and the free list."""

from __future__ import annotations

from collections.abc import Iterable


class BlockPoolError(ValueError):
    """A block id was used in a way its state does not allow (double free, bad id)."""


class BlockPool:
    """Private references per block id; a block with no references and no owner is free.

    The radix tree owns cached blocks without a private reference (`owned`), so a block is in
    exactly one of: free, owned by the tree, or privately referenced (possibly also owned).
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self.refcount = [0] * num_blocks
        self.owned = [False] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))
        self._num_private = 0

    def num_free(self) -> int:
        return len(self._free)

    def num_private(self) -> int:
        """Blocks with a private reference that the tree does not own."""
        return self._num_private

    def take(self, n: int) -> list[int]:
        """Pop n free blocks with refcount 1 (caller checked there are enough)."""
        free = self._free
        ids = free[len(free) - n :]
        del free[len(free) - n :]
        ids.reverse()
        refcount = self.refcount
        for b in ids:
            refcount[b] = 1
        self._num_private += n
        return ids

    def incref(self, block_ids: Iterable[int]) -> None:
        for b in block_ids:
            self._check_referenced(b)
            self.refcount[b] += 1

    def decref(self, block_id: int) -> int:
        """Drop one private reference; returns the remaining count (freed at 0 if not owned)."""
        self._check_referenced(block_id)
        count = self.refcount[block_id] - 1
        self.refcount[block_id] = count
        if count == 0 and not self.owned[block_id]:
            self._num_private -= 1
            self._free.append(block_id)
        return count

    def adopt_many(self, block_ids: list[int]) -> list[int]:
        """The tree takes over one private reference of each block (all checked first).

        Returns the blocks that still carry private references (shared with a sibling)."""
        refcount, owned = self.refcount, self.owned
        if block_ids and (min(block_ids) < 0 or max(block_ids) >= self.num_blocks):
            raise BlockPoolError("block id out of range")
        if len(set(block_ids)) != len(block_ids):
            raise BlockPoolError("a block id appears twice")
        for b in block_ids:
            if refcount[b] <= 0 or owned[b]:
                raise BlockPoolError(f"block {b} is not a private block of the caller")
        shared = []
        for b in block_ids:
            owned[b] = True
            count = refcount[b] - 1
            refcount[b] = count
            if count:
                shared.append(b)
        self._num_private -= len(block_ids)
        return shared

    def release_owned(self, block_ids: Iterable[int]) -> None:
        """The tree drops blocks it owned without private refs: they become free."""
        owned, free = self.owned, self._free
        for b in block_ids:
            owned[b] = False
            free.append(b)

    def free_ids(self) -> list[int]:
        return list(self._free)

    def _check_referenced(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise BlockPoolError(f"block id {block_id} out of range")
        if self.refcount[block_id] <= 0:
            raise BlockPoolError(f"block {block_id} has no private reference")
