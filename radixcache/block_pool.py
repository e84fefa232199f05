"""Refcounted block ids 0..num_blocks-1, the free list, and the hash index of cached blocks."""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np

OWNED = 1 << 24  # added to a block's state while the radix tree owns it
_MAX_ONES = 4096
_ONES = np.ones(_MAX_ONES, dtype=np.int32).tobytes()  # states of blocks with one private ref


class BlockPoolError(ValueError):
    """A block id was used in a way its state does not allow (double free, bad id)."""


class BlockPool:
    """Private references per block id; a block with no references and no owner is free.

    The radix tree owns cached blocks without a private reference (`owned`), so a block is in
    exactly one of: free, owned by the tree, or privately referenced (possibly also owned).
    One int32 per block holds both: private references + OWNED while the tree owns it. A numpy
    array, so that a run of blocks (a whole prompt at block size 1) changes state in a few
    vector operations instead of a Python step per block.

    The hash index maps a cached block's chained hash to its id. It holds exactly the blocks the
    tree has hashed (hashes are lazy: the tree indexes a node's blocks when it hashes them and
    unindexes them when it evicts them); on a collision the first block keeps the entry.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self.state = np.zeros(num_blocks, dtype=np.int32)
        self._slot = np.zeros(num_blocks, dtype=np.intp)  # scratch for the repeated-id check
        self._order_bytes = np.arange(num_blocks, dtype=np.intp).tobytes()  # block ids 0..n-1
        self._order = np.frombuffer(self._order_bytes, dtype=np.intp)
        self._free = list(range(num_blocks - 1, -1, -1))
        self._num_private = 0
        self.hash_index: dict[int, int] = {}  # chained block hash -> block id (hashed blocks)
        self.hash_collisions = 0

    # --- hash index ---
    def cached_block(self, block_hash: int) -> int | None:
        """The cached block indexed under `block_hash` (hashed blocks only)."""
        return self.hash_index.get(block_hash)

    def index_hashes(self, block_ids: Sequence[int], hashes: Sequence[int]) -> None:
        """Indexes newly hashed cached blocks."""
        index = self.hash_index
        if index.keys().isdisjoint(hashes):
            index.update(zip(hashes, block_ids, strict=True))
            return
        for b, h in zip(block_ids, hashes, strict=True):
            self.hash_collisions += index.setdefault(h, b) != b

    def unindex_hashes(self, block_ids: Sequence[int], hashes: Sequence[int]) -> None:
        """Drops evicted blocks from the index (an entry another block holds stays)."""
        index = self.hash_index
        if not self.hash_collisions:  # every hash maps to its own block: pop them in C
            deque(map(index.pop, hashes), maxlen=0)
            return
        for b, h in zip(block_ids, hashes, strict=True):
            if index.get(h) == b:
                del index[h]

    def refcount(self, block_id: int) -> int:
        return int(self.state[block_id]) % OWNED

    def owned(self, block_id: int) -> bool:
        return bool(self.state[block_id] >= OWNED)

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
            self.state[self._where(ids)] = 1
        self._num_private += n
        return ids

    def incref(self, block_ids: Iterable[int]) -> None:
        for b in block_ids:
            self._check_referenced(b)
            self.state[b] += 1

    def decref(self, block_id: int) -> int:
        """Drop one private reference; returns the remaining count (freed at 0 if not owned)."""
        self._check_referenced(block_id)
        state = int(self.state[block_id]) - 1
        self.state[block_id] = state
        if state == 0:
            self._num_private -= 1
            self._free.append(block_id)
        return state % OWNED

    def adopt_many(self, block_ids: Sequence[int]) -> list[int]:
        """The tree takes over one private reference of each block (all checked first).

        Returns the blocks that still carry other private references (the pool allows them; the
        prefix cache never passes any)."""
        n = len(block_ids)
        if not n:
            return []
        where = self._where(block_ids)
        try:
            states = self.state[where]
        except IndexError:
            raise BlockPoolError("block id out of range") from None
        # each must be private and not owned: 0 < state < OWNED. The usual case, every state 1
        # (the caller's only reference), is one memcmp; else (state - 1) as an unsigned int
        # must stay below OWNED - 1 (one reduction; top == 0: every state is 1)
        ones = n <= _MAX_ONES and states.tobytes() == _ONES[: 4 * n]
        top = 0 if ones else int((states.view(np.uint32) - np.uint32(1)).max())
        if top >= OWNED - 1:
            bad = next(b for b in block_ids if not 0 < self.state[b] < OWNED)
            raise BlockPoolError(f"block {bad} is not a private block of the caller")
        if type(where) is not slice and self._has_repeats(block_ids, where):
            raise BlockPoolError("a block id appears twice")
        self._num_private -= n
        if top == 0:  # the usual case: the caller's only reference
            self.state[where] = OWNED
            return []
        shared = states > 1  # before the update: `states` may be a view
        self.state[where] = states + (OWNED - 1)
        return self._order[where][shared].tolist()

    def _where(self, block_ids: Sequence[int]) -> slice | np.ndarray:
        """Where `block_ids` sit in `state`: a slice when they are a run of consecutive ids
        (what take() hands out from a fresh pool or a freed run; one memcmp tells), else an
        intp index array. Packed by struct as unsigned 64-bit ints (a negative id raises;
        faster than np.fromiter), viewed as intp (a uintp index costs a cast per use)."""
        try:
            packed = struct.pack(f"{len(block_ids)}Q", *block_ids)
        except struct.error:
            raise BlockPoolError("block id out of range") from None
        first = block_ids[0]
        end = first + len(block_ids)
        if end <= self.num_blocks and packed == self._order_bytes[8 * first : 8 * end]:
            return slice(first, end)
        return np.frombuffer(packed, dtype=np.intp)

    def _has_repeats(self, block_ids: Sequence[int], ids: np.ndarray) -> bool:
        if len(block_ids) <= 256:
            return len(set(block_ids)) != len(block_ids)
        order = self._order[: len(ids)]
        self._slot[ids] = order  # a repeated id keeps only its last position
        return bool(np.count_nonzero(self._slot[ids] != order))

    def release_owned(self, block_ids: Sequence[int]) -> None:
        """The tree drops blocks it owned without private refs: they become free."""
        if len(block_ids):
            self.state[self._where(block_ids)] = 0
            self._free += block_ids

    def free_ids(self) -> list[int]:
        return list(self._free)

    def _check_referenced(self, block_id: int) -> None:
        if not 0 <= block_id < self.num_blocks:
            raise BlockPoolError(f"block id {block_id} out of range")
        if self.state[block_id] % OWNED <= 0:
            raise BlockPoolError(f"block {block_id} has no private reference")
