"""AttentionMetadata: one ragged batch's layout, built once per step and shared by all layers."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class PrefillSegment:
    """One sequence with more than one new token: rows [start, end) of q attend to ctx_len keys."""

    start: int
    end: int
    ctx_len: int
    block_ids: torch.Tensor | None  # int64 [ceil(ctx_len / bs)]; None when nothing is cached
    mask: torch.Tensor | None  # bool [L, ctx_len] causal with offset; None when nothing is cached


@dataclass
class DecodePlan:
    """All sequences with exactly one new token, batched: gathered to [B, num_blocks * bs]."""

    rows: torch.Tensor  # int64 [B]: rows of q
    row_slice: slice | None  # the same rows as a slice when they are contiguous
    block_ids: torch.Tensor  # int64 [B * num_blocks]
    num_blocks: int
    mask: torch.Tensor  # bool [B, 1, 1, num_blocks * bs]: key position < seq_len


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
    # CPU (torch backend) plan, derived from the above
    prefills: list[PrefillSegment] = field(default_factory=list)
    decode: DecodePlan | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.cu_seqlens_q_list[-1])

    @property
    def cu_seqlens_q_list(self) -> list[int]:
        return [0, *np.cumsum(self.query_lens).tolist()]


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


def _prefill_segments(
    query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]], bs: int, device
) -> list[PrefillSegment]:
    segments = []
    start = 0
    for qlen, slen, blocks in zip(query_lens, seq_lens, block_tables, strict=True):
        end = start + qlen
        if qlen > 1:
            block_ids = mask = None
            if slen > qlen:
                nb = -(-slen // bs)
                block_ids = torch.tensor(blocks[:nb], dtype=torch.int64, device=device)
                key_pos = torch.arange(slen, device=device)
                query_pos = torch.arange(slen - qlen, slen, device=device)
                mask = key_pos[None, :] <= query_pos[:, None]
            segments.append(PrefillSegment(start, end, slen, block_ids, mask))
        start = end
    return segments


def _decode_plan(
    query_lens: list[int], seq_lens: list[int], block_tables: list[list[int]], bs: int, device
) -> DecodePlan | None:
    rows = [r for r, (qlen, _) in enumerate(zip(query_lens, seq_lens, strict=True)) if qlen == 1]
    if not rows:
        return None
    cu = np.cumsum([0, *query_lens])
    token_rows = cu[rows]
    lens = np.asarray(seq_lens)[rows]
    nb = int(-(-lens.max() // bs))
    table = np.zeros((len(rows), nb), dtype=np.int64)
    for i, b in enumerate(rows):
        blocks = block_tables[b][:nb]
        table[i, : len(blocks)] = blocks
    contiguous = token_rows[-1] - token_rows[0] == len(rows) - 1
    mask = torch.arange(nb * bs)[None, :] < torch.from_numpy(lens)[:, None]
    return DecodePlan(
        rows=torch.from_numpy(token_rows).to(device),
        row_slice=slice(int(token_rows[0]), int(token_rows[-1]) + 1) if contiguous else None,
        block_ids=torch.from_numpy(table.reshape(-1)).to(device),
        num_blocks=nb,
        mask=mask.view(len(rows), 1, 1, nb * bs).to(device),
    )


def build_attention_metadata(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    *,
    cpu_plan: bool = True,
) -> AttentionMetadata:
    """Metadata of one ragged batch.

    query_lens[b]: new tokens of sequence b this step (their rows are consecutive in the batch,
    in the order of the lists); seq_lens[b]: its context length after this step (cached + new);
    block_tables[b]: its block ids covering at least seq_lens[b] tokens.
    The new tokens of b sit at positions [seq_lens[b] - query_lens[b], seq_lens[b]).
    cpu_plan: also build the torch backend's per-sequence plan (cheap; not needed by triton).
    """
    device = torch.device(device)
    width = max(1, max((len(t) for t in block_tables), default=1))
    table = np.zeros((len(block_tables), width), dtype=np.int64)
    for i, blocks in enumerate(block_tables):
        table[i, : len(blocks)] = blocks
    slots = _slot_mapping(query_lens, seq_lens, table, block_size)
    cu = np.zeros(len(query_lens) + 1, dtype=np.int32)
    np.cumsum(query_lens, out=cu[1:])
    meta = AttentionMetadata(
        cu_seqlens_q=torch.from_numpy(cu).to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.from_numpy(table.astype(np.int32)).to(device),
        slot_mapping=torch.from_numpy(slots).to(device),
        max_seqlen_q=max(query_lens, default=0),
        max_seqlen_k=max(seq_lens, default=0),
        block_size=block_size,
        query_lens=list(query_lens),
        seq_lens_list=list(seq_lens),
    )
    if cpu_plan:
        meta.prefills = _prefill_segments(query_lens, seq_lens, block_tables, block_size, device)
        meta.decode = _decode_plan(query_lens, seq_lens, block_tables, block_size, device)
    return meta
