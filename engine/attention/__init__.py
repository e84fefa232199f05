"""Attention over the paged KV cache: metadata, a torch backend (CPU; native decode and prefill
kernels when they build) and triton kernels (CUDA). The backend is chosen once, by
make_attention_backend, and owns its per-step plan: plan(meta) once per forward, then
forward(..., plan, scale) per layer."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from engine.attention.metadata import (
    AttentionMetadata,
    build_attention_metadata,
    compute_positions,
)
from engine.attention.native import load_native
from engine.attention.torch_backend import TorchAttention
from engine.dtypes import cpu_flags
from engine.kv.quant import KVFormat


class AttentionBackend(Protocol):
    def plan(self, meta: AttentionMetadata) -> Any:
        """This backend's view of one step: built once, read by every layer's forward."""
        ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: Any,
        scale: float,
        window: int | None = None,
        kv_stored: bool = False,
    ) -> torch.Tensor:
        """Attention of q's rows over their sequences' keys (causal); window W: the query at
        position p attends only keys [max(0, p - W + 1), p] (a sliding-window layer).
        kv_stored: k and v are in the caches already (RowOps.rope_store_kv), not stored again."""
        ...


def native_prefill_pays(dtype: torch.dtype, flags: frozenset[str]) -> bool:
    """Whether the native prefill kernel beats torch's flash attention on a CPU with these flags
    (bench_model --attention, 1 x 1,024-2,048 tokens): with AMX, torch's bfloat16 attention runs
    its matmuls as AMX tiles (oneDNN), 2.2-2.8x the native AVX512-BF16 kernel; with AVX-512,
    torch's float32 attention is 16 lanes wide and the native float32 kernel 8 (0.7-0.9x). The
    native kernel wins on AVX2 CPUs (both dtypes, 1.3-2.2x) and AVX512-BF16 ones without AMX."""
    if dtype == torch.bfloat16:
        return "amx_bf16" not in flags
    return "avx512f" not in flags


def make_attention_backend(
    device: torch.device | str,
    native: bool | None = None,
    dtype: torch.dtype | None = None,
    head_dim: int | None = None,
    invariant: bool = False,
    prefill: bool | None = None,
    kv_format: KVFormat | None = None,
) -> AttentionBackend:
    """Triton kernels on CUDA; on CPU the torch backend, with the native kernels when native is
    True (required) or None (when they build here); native=False: pure torch. Decode tokens go
    to the native kernel; so do prefill chunks of a model in dtype with a supported head_dim where
    this CPU has a prefill kernel for that dtype (has_native_prefill: bfloat16 with AVX512-BF16
    or AVX2, float32 with AVX2) and, with prefill None, where it beats torch's
    (native_prefill_pays); prefill True: wherever it exists, False: never. invariant: every token
    through the prefill kernel, so outputs do not depend on batching, chunking or cache hits
    (EngineConfig.deterministic); an error where that kernel is missing, and on CUDA.
    kv_format: the pool holds quantized rows (engine/kv/quant.py), read by kernels of their own:
    triton on CUDA; on CPU the native kernel wherever it builds (native None or True; it is
    batch-invariant, so invariant mode runs it too), torch's dequantizing reference with
    native=False."""
    if kv_format is not None:
        return _quantized_backend(device, native, invariant, kv_format)
    if torch.device(device).type == "cuda":
        if invariant:
            raise RuntimeError("deterministic mode has no batch-invariant CUDA kernels")
        from engine.attention.triton_backend import TritonAttention

        return TritonAttention()
    module = load_native() if native is not False else None
    if native and module is None:
        raise RuntimeError("the native attention kernel could not be built on this machine")
    has_prefill = (
        module is not None
        and dtype is not None
        and head_dim in module.PREFILL_HEAD_DIMS
        and module.has_native_prefill(dtype)
    )
    if invariant and not has_prefill:
        raise RuntimeError(
            f"deterministic mode needs the native prefill kernel for {dtype} with head_dim "
            f"{head_dim}, which this CPU or build does not have"
        )
    if invariant or prefill:
        use_prefill = has_prefill
    else:  # None: where it pays; False: never
        use_prefill = prefill is None and has_prefill and native_prefill_pays(dtype, cpu_flags())
    return TorchAttention(module, native_prefill=use_prefill, invariant=invariant)


def _quantized_backend(
    device: torch.device | str, native: bool | None, invariant: bool, kv_format: KVFormat
) -> AttentionBackend:
    if torch.device(device).type == "cuda":
        if invariant:
            raise RuntimeError("deterministic mode has no batch-invariant CUDA kernels")
        from engine.attention.triton_backend import TritonAttention

        return TritonAttention(kv_format)
    module = load_native() if native is not False else None
    if module is not None:
        from engine.attention.quant_backend import QuantizedAttention

        return QuantizedAttention(module, kv_format)
    if native:
        raise RuntimeError("the native attention kernel could not be built on this machine")
    if invariant:
        raise RuntimeError(
            f"deterministic mode needs the native kernel for {kv_format.name} KV blocks, "
            "which is not built here"
        )
    from engine.attention.quant_reference import DequantizingAttention

    return DequantizingAttention(kv_format)


__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "TorchAttention",
    "build_attention_metadata",
    "compute_positions",
    "load_native",
    "make_attention_backend",
    "native_prefill_pays",
]
