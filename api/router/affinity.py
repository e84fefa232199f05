"""prompt_cache_key -> the replica the router sent that key to last (bounded, least recently used
first out). A key groups requests that share a prefix, so keeping it on one replica keeps their
prefix in one cache; the policy decides whether that replica's load still allows it."""

from __future__ import annotations

from api.router.homes import DEFAULT_MAX_HOMES, ReplicaHomes

DEFAULT_MAX_KEYS = DEFAULT_MAX_HOMES

AffinityKey = tuple[str, str]  # (the caller's tenant, "" without one; the prompt_cache_key)


def key_affinity(max_keys: int = DEFAULT_MAX_KEYS) -> ReplicaHomes[AffinityKey]:
    return ReplicaHomes(max_keys, "keys")


KeyAffinity = ReplicaHomes[AffinityKey]
