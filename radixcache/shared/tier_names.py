"""The KV tiers by name, fastest first: the device pool, then the spill tiers below it."""

from __future__ import annotations

from enum import StrEnum


class TierName(StrEnum):
    DEVICE = "device"
    HOST = "host"
    DISK = "disk"
    REDIS = "redis"


SPILL_TIERS = (TierName.HOST, TierName.DISK, TierName.REDIS)
