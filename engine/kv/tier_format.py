"""What the spill tiers hold of a device block (--tier-kv-dtype), and the conversions on the way.

auto (AsPool): the pool's rows as they are (a quantized pool's packed rows, bit for bit), under
the device namespace: the keys of existing tiers do not change.

int8 / fp8_e4m3 / fp8_e5m2 under a pool of the model's dtype (QuantizedTier): a block is quantized
on its way down (engine/kv/quant.py) and dequantized into the pool on its way back, under a
namespace whose kv_dtype names both formats ("bfloat16@int8", which codec.stored_format reads as
"int8"). Its seed differs, so do its keys: a Redis shared with engines of another tier format
never hands this one their blocks (their block hashes, seeded by the device namespace, may match).

A quantized pool with a different quantized tier format is refused: every format is a byte a
value and a scale a row, so converting would save no byte and add a second rounding.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from engine.kv.quant import KVFormat, dequantize, kv_format, quantize

if TYPE_CHECKING:
    from radixcache.hashing import Namespace


class TierFormat(Protocol):
    def namespace(self, ns: Namespace) -> Namespace:
        """The namespace the tiers key a device namespace's blocks under."""
        ...

    def down(self, kv: torch.Tensor) -> torch.Tensor:
        """A pool block [layers, 2, bs, Hkv, row] -> what the tiers store (may be a view)."""
        ...

    def up(self, block: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
        """A loaded block -> the pool's dtype, on its device."""
        ...

    def block_shape(self, pool_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of a stored block, from a pool block's."""
        ...

    def install_bytes(self, numel: int, pool_itemsize: int) -> int:
        """Bytes moved to install one loaded block of `numel` pool values (the copy estimate)."""
        ...


class AsPool:
    def namespace(self, ns: Namespace) -> Namespace:
        return ns

    def down(self, kv: torch.Tensor) -> torch.Tensor:
        return kv

    def up(self, block: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
        return block

    def block_shape(self, pool_shape: tuple[int, ...]) -> tuple[int, ...]:
        return pool_shape

    def install_bytes(self, numel: int, pool_itemsize: int) -> int:
        return numel * pool_itemsize


@dataclass(frozen=True)
class QuantizedTier:
    fmt: KVFormat

    def namespace(self, ns: Namespace) -> Namespace:
        return dataclasses.replace(ns, kv_dtype=f"{ns.kv_dtype}@{self.fmt.name}")

    def down(self, kv: torch.Tensor) -> torch.Tensor:
        return quantize(kv, self.fmt)  # on the pool's device: fewer bytes cross to the host

    def up(self, block: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
        return dequantize(block.to(pool.device), self.fmt, pool.dtype)

    def block_shape(self, pool_shape: tuple[int, ...]) -> tuple[int, ...]:
        return (*pool_shape[:-1], self.fmt.packed_dim(pool_shape[-1]))

    def install_bytes(self, numel: int, pool_itemsize: int) -> int:
        return numel * (1 + 2 * 4 + pool_itemsize)  # codes, float32 values out and in, the pool


def tier_format(pool: KVFormat | None, tier_kv_dtype: str) -> TierFormat:
    """The tiers' format for a pool of `pool` (None: the model's dtype) and --tier-kv-dtype;
    ValueError for a bad name or two different quantized formats."""
    tier = kv_format(tier_kv_dtype)
    if tier is None or tier == pool:
        return AsPool()
    if pool is not None:
        raise ValueError(
            f"--tier-kv-dtype {tier.name} with --kv-cache-dtype {pool.name}: the tiers hold a "
            f"quantized pool's blocks as they are (use auto); re-quantizing {pool.name} rows as "
            f"{tier.name} would save no byte and add a second rounding"
        )
    return QuantizedTier(tier)
