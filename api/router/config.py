"""RouterConfig: everything `radixcache route` is started with (a frozen value)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from api.config import ApiConfig
from api.router.affinity import DEFAULT_MAX_KEYS
from api.router.conversations import DEFAULT_MAX_IDS
from api.router.discovery import DnsReplicas
from api.router.policy import Balance
from api.router.replicas import ReplicaSpec


@dataclass(frozen=True)
class RouterConfig:
    replicas: tuple[ReplicaSpec, ...]
    tokenizer: Path  # the model folder (tokenizer.json, tokenizer_config.json)
    policy: str = "cache-aware"
    balance: Balance = field(default_factory=Balance)
    api: ApiConfig = field(default_factory=ApiConfig)
    block_size: int = 16  # for the approximate trees of replicas without events
    index_blocks: int = 1 << 20  # blocks each replica's index keeps (LRU beyond)
    affinity_keys: int = DEFAULT_MAX_KEYS  # prompt_cache_keys whose replica is kept (LRU beyond)
    response_ids: int = DEFAULT_MAX_IDS  # stored response ids whose replica is kept (LRU beyond)
    # the replicas keep their stored responses in one Redis (`serve --redis-url`, the same URL):
    # any replica can answer for any response id, so an id the router does not know goes where
    # the policy says instead of being searched for replica by replica
    shared_response_store: bool = False
    health_interval_s: float = 1.0
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 300.0  # an upstream silent this long mid-response is a failure
    max_attempts: int = 3  # replicas tried for a request that fails before its first byte
    replicas_dns: DnsReplicas | None = None  # replicas found (and dropped) by DNS, besides these

    def __post_init__(self) -> None:
        if not self.replicas and self.replicas_dns is None:
            raise ValueError("give at least one --replica, or --replicas-dns")
