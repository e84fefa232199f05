"""TierConfig: which spill tiers exist below device memory and how they are written."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from storage.base import Tier
from storage.codec import PACKED_CODES
from storage.disk import DiskTier
from storage.host import HostTier
from storage.pinned_host import PinnedHostTier
from storage.redis_tier import RedisTier
from storage.retention import RETAIN_S

WritePolicy = Literal["write-back", "write-through"]
DiskFsync = Literal["none", "per-file"]


@dataclass(frozen=True)
class TierConfig:
    """host_bytes=0, disk_path=None and redis_url=None switch the respective tier off.

    redis_url: `redis://HOST:PORT/DB` one server, `redis+cluster://HOST:PORT[,HOST:PORT...]` a
    Redis Cluster (any seed nodes). redis_ttl_s: seconds a block lives in Redis (None: until
    Redis's own maxmemory policy evicts it; see docs/redis-cluster.md).

    retained_bytes: the budget of blocks a persistent tier (disk, else Redis) keeps for requests
    with prompt_cache_retention 24h (retain_s), past its ordinary eviction (storage/retention.py).

    write-back (default): a block evicted from the device goes to the highest tier; each tier's
    evictions spill into the next one. write-through: additionally every stored block is written to
    Redis at once (replicas share it); evictions then spill host -> disk only.

    kv_dtype: the rows the tiers hold. auto: the device pool's, bit for bit; int8 / fp8_e4m3 /
    fp8_e5m2: a pool of the model's dtype stores blocks quantized (engine/kv/tier_format.py), about
    half the bytes, and loads dequantize them."""

    host_bytes: int = 0
    disk_path: Path | str | None = None
    disk_bytes: int = 4 << 30
    redis_url: str | None = field(default=None, repr=False)  # may hold a password
    redis_prefix: str = "radixcache"
    redis_ttl_s: int | None = 24 * 3600
    redis_timeout_s: float = 0.25  # socket connect/read timeout
    redis_cooldown_s: float = 5.0  # circuit breaker: how long Redis is skipped after a failure
    write_policy: WritePolicy = "write-back"
    deadline_s: float = 0.5  # how long a sequence waits for its load before it recomputes
    queue_blocks: int = 4096  # blocks waiting for the writer thread; more are dropped and counted
    disk_full_cooldown_s: float = 30.0  # writes stop this long after ENOSPC
    disk_fsync: DiskFsync = "none"  # per-file: fsync each block file and its folder (see disk.py)
    retained_bytes: int = 1 << 30  # prompt_cache_retention's budget in the persistent tier
    retain_s: int = RETAIN_S
    kv_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.kv_dtype != "auto" and self.kv_dtype not in PACKED_CODES:
            choices = ("auto", *PACKED_CODES)
            raise ValueError(f"tier kv dtype must be one of {choices}, got {self.kv_dtype!r}")
        if self.write_policy not in ("write-back", "write-through"):
            raise ValueError(
                f"write_policy must be write-back or write-through, not {self.write_policy!r}"
            )
        if self.disk_fsync not in ("none", "per-file"):
            raise ValueError(f"disk_fsync must be none or per-file, not {self.disk_fsync!r}")
        if min(self.host_bytes, self.disk_bytes, self.queue_blocks, self.retained_bytes) < 0:
            raise ValueError("byte budgets and queue size must be >= 0")
        if self.redis_ttl_s is not None and self.redis_ttl_s <= 0:
            raise ValueError("redis_ttl_s must be > 0 seconds, or None for no expiry")
        if self.deadline_s <= 0:
            raise ValueError("deadline_s must be > 0")
        if self.retain_s <= 0:
            raise ValueError("retain_s must be > 0")

    @property
    def enabled(self) -> bool:
        return self.host_bytes > 0 or self.disk_path is not None or self.redis_url is not None

    @property
    def persistent(self) -> bool:
        """A tier that outlives the process (disk or Redis): where retained prefixes go."""
        return self.disk_path is not None or self.redis_url is not None

    def build_tiers(self, device: torch.device | None = None) -> list[Tier]:
        """The configured tiers, fastest first: host -> disk -> redis. The host tier of a pool
        on a GPU (`device`) keeps its blocks in pinned memory."""
        tiers: list[Tier] = []
        if self.host_bytes > 0:
            on_gpu = device is not None and device.type == "cuda"
            tiers.append((PinnedHostTier if on_gpu else HostTier)(self.host_bytes))
        if self.disk_path is not None:
            tiers.append(
                DiskTier(
                    self.disk_path,
                    self.disk_bytes,
                    full_cooldown_s=self.disk_full_cooldown_s,
                    fsync=self.disk_fsync == "per-file",
                    retained_bytes=self.retained_bytes,
                    retain_s=self.retain_s,
                )
            )
        if self.redis_url is not None:
            tiers.append(
                RedisTier(
                    self.redis_url,
                    prefix=self.redis_prefix,
                    ttl_s=self.redis_ttl_s,
                    socket_timeout_s=self.redis_timeout_s,
                    cooldown_s=self.redis_cooldown_s,
                    retained_bytes=self.retained_bytes,
                    retain_s=self.retain_s,
                )
            )
        return tiers
