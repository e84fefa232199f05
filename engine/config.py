"""Engine configuration: one frozen dataclass, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.dtypes import AUTO, DTYPES
from engine.kv.quant import KVFormat, kv_format
from engine.kv.tier_format import tier_format
from engine.speculative.config import (
    DEFAULT_INDEX_TOKENS,
    DEFAULT_MODE,
    DEFAULT_NUM_TOKENS,
    DEFAULT_STEP_COST,
    SpecConfig,
)
from radixcache.policy import POLICIES

if TYPE_CHECKING:
    from engine.kv.events.config import KVEventsConfig
    from storage.tiered import TierConfig

EVICTION_POLICIES = tuple(POLICIES)


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # HF folder; None = the default model (fetched on first use)
    dtype: str = AUTO  # a DTYPES name, or "auto": engine.dtypes.resolve_dtype picks per device
    device: str = "cpu"
    block_size: int = 16
    kv_cache_memory: int = 1 << 30  # bytes for the paged KV tensor
    # the device pool's rows: the model dtype ("auto") or a quantized format (engine/kv/quant.py)
    kv_cache_dtype: str = AUTO
    num_blocks: int | None = None  # overrides kv_cache_memory when set
    # sliding-window layers (a window shorter than the context) keep a pool of their own:
    # its blocks (None: sized for as many sequences as the full pool, engine/kv/hybrid_cache.py)
    num_window_blocks: int | None = None
    release_window_blocks: bool = True  # False: sequences keep out-of-window blocks (to measure)
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None = the model's max_position_embeddings
    enable_prefix_caching: bool = True
    eviction_policy: str = "lru"  # device-pool eviction: a name of radixcache.policy.POLICIES
    max_waiting_requests: int = 1024  # bounded queue of the async front
    num_threads: int | None = None  # torch intra-op threads; None = leave as is
    tiers: TierConfig | None = None
    kv_events: KVEventsConfig | None = None  # publish changes of the cached set (ZMQ, vLLM format)
    seed: int = 0  # global sampling seed for requests without their own seed
    # outputs bit-identical whatever the batch, the chunking or the cache hits (every token's
    # attention through the native prefill kernel's fixed tiles, see make_attention_backend;
    # matmuls in calls of a row count this CPU's kernels agree on, see packed_linear)
    deterministic: bool = False
    # speculative decoding (engine/spec): draft sources and the most draft tokens per step
    speculative: str = DEFAULT_MODE
    num_speculative_tokens: int = DEFAULT_NUM_TOKENS
    speculative_step_cost: str = DEFAULT_STEP_COST  # engine/speculative/config.py STEP_COST_MODELS
    # the most tokens of finished outputs the cache drafter's suffix index keeps (all namespaces;
    # about 300 bytes a token at worst: 2**18 tokens, under 80 MiB)
    speculative_index_tokens: int = DEFAULT_INDEX_TOKENS
    # CUDA: decode steps replayed from graphs captured at start (engine/cuda_graphs/runner.py)
    cuda_graphs: bool = True
    # a step's sampled tokens stay on the device while the next step is scheduled and launched
    # (engine/step_pipeline.py); None: on CUDA only (on a CPU the forward is synchronous)
    async_scheduling: bool | None = None

    def __post_init__(self) -> None:
        if self.dtype != AUTO and self.dtype not in DTYPES:
            choices = (AUTO, *DTYPES)
            raise ValueError(f"dtype must be one of {choices}, got {self.dtype!r}")
        for name in (
            "block_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_waiting_requests",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ValueError(
                f"eviction_policy must be one of {EVICTION_POLICIES}, got {self.eviction_policy!r}"
            )
        if self.num_blocks is not None and self.num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        if self.num_window_blocks is not None and self.num_window_blocks <= 0:
            raise ValueError("num_window_blocks must be positive")
        if self.kv_cache_memory <= 0:
            raise ValueError("kv_cache_memory must be positive")
        _ = self.spec  # ValueError when invalid
        _ = self.kv_format  # ValueError when invalid
        if self.tiers is not None:
            tier_format(self.kv_format, self.tiers.kv_dtype)  # ValueError when refused
        if self.deterministic and self.device.startswith("cuda"):
            raise ValueError(
                "deterministic mode runs on CPU only: its batch-invariant kernels (the native "
                "prefill attention, matmul calls of row-invariant sizes) have no CUDA version"
            )

    @property
    def kv_format(self) -> KVFormat | None:
        """The device pool's quantized format; None: the model's dtype."""
        return kv_format(self.kv_cache_dtype)

    @property
    def quantizes_kv(self) -> bool:
        """Whether the device pool or the spill tiers hold quantized rows."""
        tiers = self.tiers is not None and kv_format(self.tiers.kv_dtype) is not None
        return self.kv_format is not None or tiers

    @property
    def pipelines_steps(self) -> bool:
        """Whether steps run one ahead of their tokens (async_scheduling, resolved)."""
        if self.async_scheduling is None:
            return self.device.startswith("cuda")
        return self.async_scheduling

    @property
    def spec(self) -> SpecConfig:
        return SpecConfig(
            self.speculative,
            self.num_speculative_tokens,
            suffix_index_tokens=self.speculative_index_tokens,
            step_cost=self.speculative_step_cost,
        )

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        unknown = set(kwargs) - set(cls.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown engine options: {sorted(unknown)}")
        return cls(**kwargs)
