"""The composition root: builds every part of an engine from its config, complete, in order.
LLMEngine only wires the step from these parts; nothing else constructs one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.analytics import CacheAnalytics
from engine.cuda_graphs import build_decode_graphs, graph_memory_reserve
from engine.dtypes import resolve_dtype
from engine.kv import KVCacheManager, NoPrefixCacheManager
from engine.kv.admin import CacheAdmin
from engine.kv.events import KVEventSink, ZmqEventPublisher
from engine.kv.hybrid_cache import HybridKVCache, KVGroups
from engine.kv.paged_cache import DTYPES, KVCache
from engine.kv.tier_format import tier_format
from engine.kv.tiers import KVTiers
from engine.model_runner import ModelRunner
from engine.models.key_smoothing import smooth_keys
from engine.sampler import Sampler
from engine.scheduler import Scheduler
from engine.speculative.speculator import Speculator, build_speculator
from engine.stats import EngineStats
from engine.stop_checker import StopChecker
from engine.structured.compiler import GrammarCompiler
from engine.structured.guide import Guide
from radixcache.hashing import Namespace
from radixcache.prefix_cache import PrefixCache
from radixcache.window_blocks import WindowBlocks

if TYPE_CHECKING:
    from engine.config import EngineConfig


@dataclass(frozen=True)
class EngineParts:
    model_path: Path
    model: torch.nn.Module
    tokenizer: Any  # engine.loader.tokenizer.Tokenizer
    max_model_len: int
    vocab_size: int
    namespace: Namespace
    kv: KVCacheManager  # the one door to the KV pools, the prefix cache, tiers and events
    scheduler: Scheduler
    runner: ModelRunner
    sampler: Sampler
    stop: StopChecker
    grammars: GrammarCompiler
    guide: Guide
    stats: EngineStats
    analytics: CacheAnalytics
    admin: CacheAdmin
    speculator: Speculator | None


def build_parts(config: EngineConfig) -> EngineParts:
    from engine.loader import ensure_default_model, load_model, load_tokenizer

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    path = Path(config.model) if config.model else ensure_default_model()
    dtype_name = resolve_dtype(config.dtype, config.device)
    device, dtype = torch.device(config.device), DTYPES[dtype_name]
    model = load_model(path, dtype, device, prepack=False, invariant=config.deterministic)
    if config.quantizes_kv:
        smooth_keys(model)  # keys' outlier channels shrunk, the scores kept exactly
    model.prepack()
    if config.kv_format is not None:
        model.use_kv_format(config.kv_format)
    mc = model.config
    max_model_len = min(
        config.max_model_len or mc.max_position_embeddings, mc.max_position_embeddings
    )
    kv_cache = _build_kv_cache(config, mc, dtype, device, max_model_len)
    windows = None
    if isinstance(kv_cache, HybridKVCache):
        windows = WindowBlocks(
            kv_cache.num_window_blocks,
            kv_cache.num_blocks,
            config.block_size,
            kv_cache.groups.window,
        )
    prefix_cache = PrefixCache(
        kv_cache.num_blocks, config.block_size, policy=config.eviction_policy, windows=windows
    )
    window = kv_cache.groups.window if isinstance(kv_cache, HybridKVCache) else None
    publisher, sink = _build_events(config, window)
    tiers = _build_tiers(config, kv_cache, sink, windows)
    if config.enable_prefix_caching:
        listeners = tuple(x for x in (tiers, sink) if x is not None)
        kv: KVCacheManager = KVCacheManager(
            prefix_cache,
            kv_cache,
            tiers=tiers,
            listeners=listeners,
            publisher=publisher,
            release_window_blocks=config.release_window_blocks,
        )
    else:
        kv = NoPrefixCacheManager(prefix_cache, kv_cache, config.release_window_blocks)
    scheduler = Scheduler(
        kv,
        config.max_num_seqs,
        config.max_num_batched_tokens,
        max_model_len,
    )
    tokenizer = load_tokenizer(path)
    namespace = Namespace(
        model_id=model.model_id,
        kv_dtype=config.kv_format.name if config.kv_format else dtype_name,
        block_size=config.block_size,
    )
    grammars = GrammarCompiler(
        tokenizer.backend.to_str,  # read on the first constraint only
        mc.vocab_size,
        list(tokenizer.eos_token_ids),
    )
    stats = EngineStats()
    return EngineParts(
        model_path=path,
        model=model,
        tokenizer=tokenizer,
        max_model_len=max_model_len,
        vocab_size=mc.vocab_size,
        namespace=namespace,
        kv=kv,
        scheduler=scheduler,
        runner=ModelRunner(
            model, kv_cache, device, build_decode_graphs(config, model, kv_cache, max_model_len)
        ),
        sampler=Sampler(config.seed),
        stop=StopChecker(set(tokenizer.eos_token_ids), max_model_len),
        grammars=grammars,
        guide=Guide(grammars, mc.vocab_size),
        stats=stats,
        analytics=CacheAnalytics(stats, scheduler, kv),
        admin=CacheAdmin(kv, namespace, scheduler.holders),
        speculator=build_speculator(config, kv, max_model_len, stats.spec),
    )


def _build_kv_cache(
    config: EngineConfig, mc: Any, dtype: torch.dtype, device: torch.device, max_model_len: int
) -> KVCache:
    """One paged pool, or two when some layers' windows are shorter than the context."""
    groups = KVGroups.of(mc.layer_windows, max_model_len)
    if groups is None:
        return KVCache.from_budget(
            mc.num_hidden_layers,
            config.block_size,
            mc.num_key_value_heads,
            mc.head_dim,
            dtype,
            device,
            memory_bytes=config.kv_cache_memory - graph_memory_reserve(config, mc, dtype),
            num_blocks=config.num_blocks,
            scratch_block=config.cuda_graphs,  # padding rows of graph steps write here (CPU tests replay graphs eagerly)
            kv_format=config.kv_format,
        )
    return HybridKVCache.build(
        groups,
        block_size=config.block_size,
        num_kv_heads=mc.num_key_value_heads,
        head_dim=mc.head_dim,
        dtype=dtype,
        device=device,
        max_model_len=max_model_len,
        max_num_seqs=config.max_num_seqs,
        max_chunk=config.max_num_batched_tokens,
        memory_bytes=config.kv_cache_memory,
        num_blocks=config.num_blocks,
        num_window_blocks=config.num_window_blocks,
        kv_format=config.kv_format,
    )


def _build_events(
    config: EngineConfig, window: int | None
) -> tuple[ZmqEventPublisher | None, KVEventSink | None]:
    if config.kv_events is None or not config.enable_prefix_caching:
        return None, None
    publisher = ZmqEventPublisher(config.kv_events)
    sink = KVEventSink(publisher, config.block_size, window)
    sink.cache_cleared()  # the device pool starts empty: consumers drop what they knew of us
    return publisher, sink


def _build_tiers(
    config: EngineConfig,
    kv_cache: KVCache,
    sink: KVEventSink | None,
    windows: WindowBlocks | None,
) -> KVTiers | None:
    if config.tiers is None:
        return None
    from storage.tiered import TieredStore

    fmt = tier_format(config.kv_format, config.tiers.kv_dtype)
    store = TieredStore(config.tiers, observer=sink, device=kv_cache.tensor.device)
    return KVTiers(store, kv_cache, windows, fmt)
