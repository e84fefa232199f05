"""The prefix index: namespaces, chained block hashes, a radix tree over refcounted blocks."""

from radixcache.hashing import Namespace, block_hashes
from radixcache.integrity import IntegrityError
from radixcache.policy import EvictionPolicy, LRUPolicy
from radixcache.prefix_cache import EvictedBlock, InsertResult, MatchResult, PrefixCache
from radixcache.stats import CacheStats, NamespaceStats, PrefixInfo

__all__ = [
    "CacheStats",
    "EvictedBlock",
    "EvictionPolicy",
    "InsertResult",
    "IntegrityError",
    "LRUPolicy",
    "MatchResult",
    "Namespace",
    "NamespaceStats",
    "PrefixCache",
    "PrefixInfo",
    "block_hashes",
]
