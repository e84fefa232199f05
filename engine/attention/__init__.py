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
    ) -> torch.Tensor: ...


def make_attention_backend(
    device: torch.device | str,
    native: bool | None = None,
    dtype: torch.dtype | None = None,
    head_dim: int | None = None,
    invariant: bool = False,
) -> AttentionBackend:
    """Triton kernels on CUDA; on CPU the torch backend, with the native kernels when native is
    True (required) or None (when they build here); native=False: pure torch. Decode tokens go
    to the native kernel; so do prefill chunks of a model in dtype with a supported head_dim where
    this CPU has a prefill kernel for that dtype (has_native_prefill: bfloat16 with AVX512-BF16
    or AVX2, float32 with AVX2). invariant: every token through the prefill kernel, so outputs do
    not depend on batching, chunking or cache hits (EngineConfig.deterministic); an error where
    that kernel is missing."""
    if torch.device(device).type == "cuda":
        from engine.attention.triton_backend import TritonAttention

        return TritonAttention()
    module = load_native() if native is not False else None
    if native and module is None:
        raise RuntimeError("the native attention kernel could not be built on this machine")
    prefill = (
        module is not None
        and dtype is not None
        and head_dim in module.PREFILL_HEAD_DIMS
        and module.has_native_prefill(dtype)
    )
    if invariant and not prefill:
        raise RuntimeError(
            f"deterministic mode needs the native prefill kernel for {dtype} with head_dim "
            f"{head_dim}, which this CPU or build does not have"
        )
    return TorchAttention(module, native_prefill=prefill, invariant=invariant)


__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "TorchAttention",
    "build_attention_metadata",
    "compute_positions",
    "load_native",
    "make_attention_backend",
]
