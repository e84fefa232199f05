"""The KV cache manager: the one owner of a KV block's life that the scheduler talks to."""

from engine.kv.manager import KVCacheManager, MatchState, blocks_for
from engine.kv.no_cache import NoPrefixCacheManager

__all__ = ["KVCacheManager", "MatchState", "NoPrefixCacheManager", "blocks_for"]
