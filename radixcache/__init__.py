"""The prefix index: namespaces, chained block hashes, a radix tree over refcounted blocks."""

from radixcache.hashing import Namespace, block_hashes
from radixcache.integrity import IntegrityError
from radixcache.policy import EvictionPolicy, FrequencyAgeingPolicy, LRUPolicy, make_policy
from radixcache.prefix_cache import EvictedBlock, InsertResult, MatchResult, PrefixCache
from radixcache.stats import CacheStats, MissRatioPoint, NamespaceStats, PrefixInfo

__all__ = [
    "CacheStats",
    "EvictedBlock",
    "EvictionPolicy",
    "FrequencyAgeingPolicy",
    "InsertResult",
    "IntegrityError",
    "LRUPolicy",
    "MatchResult",
    "MissRatioPoint",
    "Namespace",
    "NamespaceStats",
    "PrefixCache",
    "PrefixInfo",
    "block_hashes",
    "make_policy",
]
