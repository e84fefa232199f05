"""Attention over the paged KV cache: metadata, a torch backend (CPU) and triton kernels (CUDA)."""

from __future__ import annotations

from typing import Protocol

import torch

from engine.attention.metadata import (
    AttentionMetadata,
    build_attention_metadata,
    compute_positions,
)
from engine.attention.torch_backend import TorchAttention


class AttentionBackend(Protocol):
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor: ...


def make_attention_backend(device: torch.device | str) -> AttentionBackend:
    """Torch reference on CPU; triton kernels on CUDA."""
    if torch.device(device).type == "cuda":
        from engine.attention.triton_backend import TritonAttention

        return TritonAttention()
    return TorchAttention()


__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "TorchAttention",
    "build_attention_metadata",
    "compute_positions",
    "make_attention_backend",
]
