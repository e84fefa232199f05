"""Refcounted block ids 0..num_blocks-1 and the free list."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


class BlockPoolError(ValueError):
    """A block id was used in a way its state does not allow (double free, bad id)."""


class BlockPool:
    """Private references per block id; a block with no references and no owner is free.

    The radix tree owns cached blocks without a private reference (`owned`), so a block is in
    exactly one of: free, owned by the tree, or privately referenced (possibly also owned).
    `refcount` and `owned` are numpy arrays so that a run of blocks (a whole prompt at block
    size 1) changes state in a few vector operations instead of a Python step per block.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self.refcount = np.zeros(num_blocks, dtype=np.int32)
        self.owned = np.zeros(num_blocks, dtype=np.bool_)
        self._slot = np.zeros(num_blocks, dtype=np.intp)  # scratch for the duplicate check
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
        if ids:
            self.refcount[ids] = 1
        self._num_private += n
        return ids

    def incref(self, block_ids: Iterable[int]) -> None:
        for b in block_ids:
            self._check_referenced(b)
            self.refcount[b] += 1

    def decref(self, block_id: int) -> int:
        """Drop one private reference; returns the remaining count (freed at 0 if not owned)."""
        self._check_referenced(block_id)
        count = int(self.refcount[block_id]) - 1
        self.refcount[block_id] = count
        if count == 0 and not self.owned[block_id]:
            self._num_private -= 1
            self._free.append(block_id)
        return count

    def adopt_many(self, block_ids: Sequence[int]) -> list[int]:
        """The tree takes over one private reference of each block (all checked first).

        Returns the blocks that still carry private references (shared with a sibling)."""
        n = len(block_ids)
        if not n:
            return []
        ids = np.fromiter(block_ids, dtype=np.intp, count=n)
        if ids.min() < 0 or ids.max() >= self.num_blocks:
            raise BlockPoolError("block id out of range")
        counts = self.refcount[ids]
        if counts.min() <= 0 or self.owned[ids].any():
            bad = next(b for b in block_ids if self.refcount[b] <= 0 or self.owned[b])
            raise BlockPoolError(f"block {bad} is not a private block of the caller")
        if self._has_repeats(block_ids, ids):
            raise BlockPoolError("a block id appears twice")
        self.owned[ids] = True
        self.refcount[ids] = counts - 1
        self._num_private -= n
        return ids[counts > 1].tolist() if counts.max() > 1 else []

    def _has_repeats(self, block_ids: Sequence[int], ids: np.ndarray) -> bool:
        if len(block_ids) <= 64:
            return len(set(block_ids)) != len(block_ids)
        order = np.arange(len(ids), dtype=np.intp)
        self._slot[ids] = order  # a repeated id keeps only its last position
        return bool((self._slot[ids] != order).any())

    def release_owned(self, block_ids: Sequence[int]) -> None:
        """The tree drops blocks it owned without private refs: they become free."""
        if len(block_ids):
            self.owned[np.fromiter(block_ids, dtype=np.intp, count=len(block_ids))] = False
            self._free += block_ids

    def free_ids(self) -> list[int]:
        return list(self._free)

    def _check_referenced(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise BlockPoolError(f"block id {block_id} out of range")
        if self.refcount[block_id] <= 0:
            raise BlockPoolError(f"block {block_id} has no private reference")
