"""Spill tiers below device memory: host RAM, local disk and Redis, chained by a TieredStore.

Public API (what the engine uses):
    TierConfig(host_bytes, disk_path, disk_bytes, redis_url, write_policy, deadline_s, ...)
    TieredStore(config)
        .store(ns, [(block_hash, kv)])                  on device eviction; copies, never blocks
        .write_through / .publish(ns, [(block_hash, kv)]) computed blocks to Redis at once
        .can_retain / .retain(ns, [(block_hash, kv)])   a prefix kept in disk / Redis for 24 h
        .start_load(ns, hashes, deadline_s=None, shape=None) -> PendingLoad (returns at once)
            .ready(now) / .wait(timeout) / .take() -> LoadResult(tiers, blocks) / .cancel()
        .load_prefix(ns, hashes, deadline_s=None, shape=None) -> LoadResult  (blocking form)
        .locate(ns, hashes) -> [tier name]; .lookup_tokens(ns, hashes) -> {tier: tokens}
        .stats() -> StoreSnapshot(tiers={name: TierSnapshot}, store, pending_blocks, retention)
        .wait_idle()
    Tiers (HostTier, DiskTier, RedisTier): batch contains / get / put / delete by block hash.
    Codec: encode_block(kv, kv_format=None) -> bytes; decode_block(bytes, kv_format, shape) ->
        tensor | CorruptBlock. A namespace's kv_dtype names its blocks' format (stored_format):
        "bfloat16", or a quantized one of packed uint8 rows ("int8", "bfloat16@int8").
A block's KV is kv_cache[:, :, block_id]: [num_layers, 2, block_size, num_kv_heads, head_dim].
"""

from storage.base import Tier, TierStats
from storage.codec import CorruptBlock, decode_block, encode_block, verify_block
from storage.config import TierConfig
from storage.disk import DiskTier
from storage.host import HostTier
from storage.redis_tier import RedisTier
from storage.store_stats import StoreSnapshot, StoreStats, TierSnapshot
from storage.tiered import LoadResult, TieredStore

__all__ = [
    "CorruptBlock",
    "DiskTier",
    "HostTier",
    "LoadResult",
    "RedisTier",
    "StoreSnapshot",
    "StoreStats",
    "Tier",
    "TierConfig",
    "TierSnapshot",
    "TierStats",
    "TieredStore",
    "decode_block",
    "encode_block",
    "verify_block",
]
