"""Namespaces and chained block hashes (xxh3_64, deterministic across processes)."""

from __future__ import annotations

import dataclasses
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import islice

import numpy as np
import xxhash

_xxh3 = xxhash.xxh3_64_intdigest
_ZERO8 = bytes(8)


@dataclass(frozen=True)
class Namespace:
    """Everything that makes KV bytes differ; two namespaces never share a block."""

    model_id: str
    kv_dtype: str
    block_size: int
    layout_version: int = 1
    cache_salt: str = ""

    @cached_property
    def seed(self) -> int:
        fields = (
            self.model_id,
            self.kv_dtype,
            self.block_size,
            self.layout_version,
            self.cache_salt,
        )
        text = "\x1f".join(str(f) for f in fields)
        return _xxh3(b"radixcache-namespace\x00" + text.encode("utf-8"))

    def __hash__(self) -> int:  # the cached seed: the tree looks namespaces up on every call
        return self.seed

    @cached_property
    def seed_bytes(self) -> bytes:
        return self.seed.to_bytes(8, "little")

    @property
    def hex(self) -> str:
        return f"{self.seed:016x}"

    def with_salt(self, salt: str) -> Namespace:
        """This namespace for a tenant's cache_salt (itself when the salt is its own)."""
        return self if salt == self.cache_salt else dataclasses.replace(self, cache_salt=salt)


def token_bytes(tokens: Sequence[int] | np.ndarray | array) -> bytes:
    """Token ids as little-endian int32 bytes (struct packs Python ints faster than numpy
    converts them; numpy and array("q") ids are converted by numpy, without an int each)."""
    if type(tokens) is array and tokens.typecode == "q":
        return np.frombuffer(tokens, dtype=np.int64).astype("<i4").tobytes()
    if isinstance(tokens, np.ndarray):
        return tokens.astype("<i4", copy=False).tobytes()
    return struct.pack(f"<{len(tokens)}i", *tokens)


def block_hashes(
    namespace: Namespace,
    tokens: Sequence[int] | np.ndarray | array,
    parent_hash: int | None = None,
) -> list[int]:
    """Chained xxh3_64 hashes of the full blocks of `tokens`.

    h_i = xxh3_64(h_{i-1} (8 LE bytes) || seed (8 LE bytes, first block of a chain only) || tokens).
    `parent_hash=None` starts a chain at position 0 (h_{-1} = 0); otherwise the chain continues
    after the block whose hash is `parent_hash`.
    """
    size = namespace.block_size * 4
    data = token_bytes(tokens)
    n = len(data) // size
    if n == 0:
        return []
    blocks = np.frombuffer(data, dtype=f"V{size}", count=n).tolist()  # bytes per block, in C
    if parent_hash is None:
        h = _xxh3(_ZERO8 + namespace.seed_bytes + blocks[0])
    else:
        h = _xxh3(parent_hash.to_bytes(8, "little") + blocks[0])
    return [h, *[h := _xxh3(h.to_bytes(8, "little") + b) for b in islice(blocks, 1, None)]]
