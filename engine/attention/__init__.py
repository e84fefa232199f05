"""Attention over the paged KV cache: metadata, a torch backend (CPU; native decode kernel when
it builds) and triton kernels (CUDA). The backend is chosen once, by make_attention_backend, and
owns its per-step plan: plan(meta) once per forward, then forward(..., plan, scale) per layer."""

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
    device: torch.device | str, native: bool | None = None
) -> AttentionBackend:
    """Triton kernels on CUDA; on CPU the torch backend, with the native decode kernel when
    native is True (required) or None (when it builds here); native=False: pure torch."""
    if torch.device(device).type == "cuda":
        from engine.attention.triton_backend import TritonAttention

        return TritonAttention()
    module = load_native() if native is not False else None
    if native and module is None:
        raise RuntimeError("the native attention kernel could not be built on this machine")
    return TorchAttention(module)


__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "TorchAttention",
    "build_attention_metadata",
    "compute_positions",
    "load_native",
    "make_attention_backend",
]
