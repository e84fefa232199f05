"""AttentionMetadata: one ragged batch's layout, built once per step and shared by all layers.

Backend-neutral; each attention backend derives its own plan from it (see AttentionBackend.plan).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class AttentionMetadata:
    cu_seqlens_q: torch.Tensor  # int32 [B+1]: new tokens of sequence b are q[cu[b]:cu[b+1]]
    seq_lens: torch.Tensor  # int32 [B]: context length of b after this step (cached + new)
    block_tables: torch.Tensor  # int32 [B, max_blocks_per_seq] (padded with 0)
    slot_mapping: torch.Tensor  # int64 [T]: where each new token's K/V is written
    max_seqlen_q: int
    max_seqlen_k: int
    block_size: int
    query_lens: list[int]
    seq_lens_list: list[int]
    block_tables_list: list[list[int]]
    # [B]: b's rows are a speculative verify (its last token, then its draft tokens): the
    # kernels attend each row as the decode step at its position would
    verify: list[bool]


def compute_positions(query_lens: list[int], seq_lens: list[int]) -> np.ndarray:
    """Positions [T] (int64 numpy) of the new tokens: [seq_len - query_len, seq_len) per sequence."""
    q = np.asarray(query_lens, dtype=np.int64)
    # row t of sequence b: seq_lens[b] - query_lens[b] + (t - cu[b]) = (seq_lens[b] - cu[b+1]) + t
    offsets = np.repeat(np.asarray(seq_lens, dtype=np.int64) - np.cumsum(q), q)
    return offsets + np.arange(int(q.sum()), dtype=np.int64)


def _slot_mapping(
    query_lens: list[int], seq_lens: list[int], table: np.ndarray, bs: int
) -> np.ndarray:
    positions = compute_positions(query_lens, seq_lens)
    seq_index = np.repeat(np.arange(len(query_lens)), query_lens)
    return table[seq_index, positions // bs] * bs + positions % bs


def build_attention_metadata(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    verify: list[bool] | None = None,
) -> AttentionMetadata:
    """Metadata of one ragged batch.

    query_lens[b]: new tokens of sequence b this step (their rows are consecutive in the batch,
    in the order of the lists); seq_lens[b]: its context length after this step (cached + new);
    block_tables[b]: its block ids covering at least seq_lens[b] tokens; verify[b]: its rows are
    a speculative verify (AttentionMetadata.verify; default none).
    The new tokens of b sit at positions [seq_lens[b] - query_lens[b], seq_lens[b]).
    Backend-neutral: a backend derives its own per-step plan from it (AttentionBackend.plan).
    """
    device = torch.device(device)
    width = max(1, max((len(t) for t in block_tables), default=1))
    table = np.zeros((len(block_tables), width), dtype=np.int64)
    for i, blocks in enumerate(block_tables):
        table[i, : len(blocks)] = blocks
    slots = _slot_mapping(query_lens, seq_lens, table, block_size)
    cu = np.zeros(len(query_lens) + 1, dtype=np.int32)
    np.cumsum(query_lens, out=cu[1:])
    return AttentionMetadata(
        cu_seqlens_q=torch.from_numpy(cu).to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.from_numpy(table.astype(np.int32)).to(device),
        slot_mapping=torch.from_numpy(slots).to(device),
        max_seqlen_q=max(query_lens, default=0),
        max_seqlen_k=max(seq_lens, default=0),
        block_size=block_size,
        query_lens=list(query_lens),
        seq_lens_list=list(seq_lens),
        block_tables_list=[list(t) for t in block_tables],
        verify=list(verify) if verify is not None else [False] * len(query_lens),
    )
