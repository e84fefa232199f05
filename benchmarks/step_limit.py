"""The least time a model step can take on this hardware: its bytes over the memory bandwidth or
its arithmetic at the matmul peak, whichever is larger.

    bytes = weights of every projection and of the head (each read once per step)
            + K and V of every distinct key the step attends (every layer; a prefix shared by
              several sequences counted once)
    flops = 2 * projection params * new tokens + 2 * head params * sampled rows
            + 4 * Hq * D * layers * (keys attended, summed over the new tokens)
    limit = max(bytes / memory read bandwidth, flops / bf16 matmul peak)

The embeddings' rows, norms and activations are left out (under 1% of the bytes of a decode step
of the default model)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.config import ModelConfig


@dataclass(frozen=True)
class ModelCosts:
    """A model's per-step quantities, from its config and dtype."""

    linear_params: int  # every layer's q, k, v, o, gate, up and down projections
    head_params: int  # the logits projection (vocab x hidden)
    kv_bytes_per_key: int  # K and V of one token, every layer
    attention_flops_per_key: int  # one query token against one key, every layer (QK and PV)
    element_bytes: int

    @staticmethod
    def of(config: ModelConfig, dtype: torch.dtype) -> ModelCosts:
        c = config
        per_layer = c.hidden_size * (2 * c.q_size + 2 * c.kv_size + 3 * c.intermediate_size)
        elem = torch.empty((), dtype=dtype).element_size()
        return ModelCosts(
            linear_params=c.num_hidden_layers * per_layer,
            head_params=c.vocab_size * c.hidden_size,
            kv_bytes_per_key=c.num_hidden_layers * 2 * c.kv_size * elem,
            attention_flops_per_key=4 * c.num_attention_heads * c.head_dim * c.num_hidden_layers,
            element_bytes=elem,
        )

    @property
    def weight_bytes(self) -> int:
        return (self.linear_params + self.head_params) * self.element_bytes


@dataclass(frozen=True)
class StepLimit:
    bytes: int
    flops: int
    memory_s: float  # bytes / bandwidth
    compute_s: float  # flops / matmul peak

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s)


def step_limit(
    costs: ModelCosts,
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    memory_gbps: float,
    matmul_gflops: float,
) -> StepLimit:
    """The limit of one step of these sequences (each sampling one row), new tokens at the end of
    each sequence's context, at this bandwidth (read) and matmul peak."""
    distinct = set()
    attended = 0
    for q, n, table in zip(query_lens, seq_lens, block_tables, strict=True):
        distinct.update((table[p // block_size], p % block_size) for p in range(n))
        attended += sum(p + 1 for p in range(n - q, n))  # causal: a token sees keys up to it
    total_bytes = costs.weight_bytes + len(distinct) * costs.kv_bytes_per_key
    flops = (
        2 * costs.linear_params * sum(query_lens)
        + 2 * costs.head_params * len(query_lens)
        + costs.attention_flops_per_key * attended
    )
    return StepLimit(
        total_bytes, flops, total_bytes / (memory_gbps * 1e9), flops / (matmul_gflops * 1e9)
    )
