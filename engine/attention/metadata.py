"""AttentionMetadata: one ragged batch's layout, built once per step and shared by all layers."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

MIN_SHARED_BLOCKS = 1  # a shared prefix shorter than this is attended per sequence


@dataclass
class AdditiveMask:
    """A float mask (0 = attend, -inf = masked), cast once per dtype and reused by every layer."""

    float32: torch.Tensor
    _by_dtype: dict[torch.dtype, torch.Tensor] = field(default_factory=dict)

    @staticmethod
    def from_bool(allowed: torch.Tensor) -> AdditiveMask:
        return AdditiveMask(torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf")))

    def to(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self._by_dtype:
            self._by_dtype[dtype] = self.float32.to(dtype)
        return self._by_dtype[dtype]


@dataclass
class BlockRun:
    """Block ids to read keys from; `span` = (first, end) when they are consecutive ids, so the
    cache can be sliced (a view) instead of gathered (a copy)."""

    ids: torch.Tensor  # int64 [num_blocks]
    span: tuple[int, int] | None

    @staticmethod
    def of(blocks: list[int], device) -> BlockRun:
        consecutive = all(b == blocks[0] + i for i, b in enumerate(blocks))
        span = (blocks[0], blocks[0] + len(blocks)) if blocks and consecutive else None
        return BlockRun(torch.tensor(blocks, dtype=torch.int64, device=device), span)


@dataclass
class SharedPrefix:
    """Sequences whose block tables start with the same full blocks, all cached before this step:
    every new token of theirs attends all of those keys, so they are attended once for the group."""

    rows: torch.Tensor  # int64 [R]: rows of q of every member's new tokens
    blocks: BlockRun
    num_tokens: int  # num_blocks * block_size


@dataclass
class CausalBatch:
    """n sequences with L new tokens each and no other keys than those (beyond a shared prefix):
    plain causal attention, batched. Their rows are rows[i * L : (i + 1) * L] for sequence i."""

    rows: torch.Tensor | slice  # n * L rows of q (a slice when consecutive)
    n: int
    length: int


@dataclass
class PrefillSegment:
    """One sequence with more than one new token and cached keys of its own: q rows
    [start, end) attend keys [key_start, ctx_len) (keys [0, key_start) via its SharedPrefix)."""

    start: int
    end: int
    key_start: int
    ctx_len: int
    blocks: BlockRun  # blocks holding keys [key_start, ctx_len)
    mask: AdditiveMask  # [L, ctx_len - key_start] causal with offset


@dataclass
class DecodePlan:
    """Every sequence with exactly one new token, batched: its keys [key_start, seq_len) gathered
    to [B, num_blocks * bs] and masked by length."""

    rows: torch.Tensor  # int64 [B]: rows of q
    row_slice: slice | None  # the same rows as a slice when they are contiguous
    block_ids: torch.Tensor  # int64 [B * num_blocks]
    num_blocks: int
    mask: AdditiveMask  # [B, 1, 1, num_blocks * bs]


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
    # the torch backend's plan (built when cpu_plan=True)
    shared: list[SharedPrefix] = field(default_factory=list)
    causal: list[CausalBatch] = field(default_factory=list)
    prefills: list[PrefillSegment] = field(default_factory=list)
    decode: DecodePlan | None = None


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


def _shared_prefixes(
    query_lens: list[int], seq_lens: list[int], tables: list[list[int]], bs: int
) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """(shared tokens per sequence, [(member sequences, shared block ids)]).

    Sequences are grouped by their first block; a group shares the longest common run of leading
    blocks that lies wholly before every member's first new token."""
    by_first: dict[int, list[int]] = {}
    for b, (qlen, slen) in enumerate(zip(query_lens, seq_lens, strict=True)):
        if (slen - qlen) // bs >= MIN_SHARED_BLOCKS:
            by_first.setdefault(tables[b][0], []).append(b)
    shared_len = [0] * len(query_lens)
    groups = []
    for members in by_first.values():
        if len(members) < 2:
            continue
        limit = min((seq_lens[b] - query_lens[b]) // bs for b in members)
        first = tables[members[0]]
        n = 0
        while n < limit and all(tables[b][n] == first[n] for b in members):
            n += 1
        if n >= MIN_SHARED_BLOCKS:
            groups.append((members, first[:n]))
            for b in members:
                shared_len[b] = n * bs
    return shared_len, groups


def _prefill_segment(start, qlen, slen, key_start, blocks, bs, device) -> PrefillSegment:
    first, last = key_start // bs, -(-slen // bs)
    key_pos = torch.arange(key_start, slen)
    query_pos = torch.arange(slen - qlen, slen)
    mask = AdditiveMask.from_bool(key_pos[None, :] <= query_pos[:, None])
    mask.float32 = mask.float32.to(device)
    run = BlockRun.of(blocks[first:last], device)
    return PrefillSegment(start, start + qlen, key_start, slen, run, mask)


def _causal_batches(starts_by_len: dict[int, list[int]], device) -> list[CausalBatch]:
    batches = []
    for length, starts in starts_by_len.items():
        consecutive = all(s == starts[0] + i * length for i, s in enumerate(starts))
        if consecutive:
            rows: torch.Tensor | slice = slice(starts[0], starts[0] + len(starts) * length)
        else:
            rows = torch.from_numpy(np.concatenate([np.arange(s, s + length) for s in starts])).to(
                device
            )
        batches.append(CausalBatch(rows, len(starts), length))
    return batches


def _decode_plan(decodes, cu, seq_lens, key_starts, tables, bs, device) -> DecodePlan:
    token_rows = cu[decodes]
    lens = np.asarray([seq_lens[b] - key_starts[b] for b in decodes])
    nb = int(-(-lens.max() // bs))
    table = np.zeros((len(decodes), nb), dtype=np.int64)
    for i, b in enumerate(decodes):
        blocks = tables[b][key_starts[b] // bs : key_starts[b] // bs + nb]
        table[i, : len(blocks)] = blocks
    contiguous = token_rows[-1] - token_rows[0] == len(decodes) - 1
    allowed = torch.arange(nb * bs)[None, :] < torch.from_numpy(lens)[:, None]
    mask = AdditiveMask.from_bool(allowed.view(len(decodes), 1, 1, nb * bs))
    mask.float32 = mask.float32.to(device)
    return DecodePlan(
        rows=torch.from_numpy(token_rows).to(device),
        row_slice=slice(int(token_rows[0]), int(token_rows[-1]) + 1) if contiguous else None,
        block_ids=torch.from_numpy(table.reshape(-1)).to(device),
        num_blocks=nb,
        mask=mask,
    )


def _build_cpu_plan(meta: AttentionMetadata, tables: list[list[int]], device) -> None:
    query_lens, seq_lens, bs = meta.query_lens, meta.seq_lens_list, meta.block_size
    key_starts, groups = _shared_prefixes(query_lens, seq_lens, tables, bs)
    cu = np.zeros(len(query_lens) + 1, dtype=np.int64)
    np.cumsum(query_lens, out=cu[1:])
    for members, blocks in groups:
        rows = np.concatenate([np.arange(cu[b], cu[b + 1]) for b in members])
        meta.shared.append(
            SharedPrefix(
                rows=torch.from_numpy(rows).to(device),
                blocks=BlockRun.of(blocks, device),
                num_tokens=len(blocks) * bs,
            )
        )
    decodes, causal_starts = [], {}
    for b, (qlen, slen) in enumerate(zip(query_lens, seq_lens, strict=True)):
        if qlen == 1:
            decodes.append(b)
        elif qlen > 1 and slen - key_starts[b] == qlen:  # its only other keys: its new tokens
            causal_starts.setdefault(qlen, []).append(int(cu[b]))
        elif qlen > 1:
            seg = _prefill_segment(int(cu[b]), qlen, slen, key_starts[b], tables[b], bs, device)
            meta.prefills.append(seg)
    meta.causal = _causal_batches(causal_starts, device)
    if decodes:
        meta.decode = _decode_plan(decodes, cu, seq_lens, key_starts, tables, bs, device)


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
    cpu_plan: also build the torch backend's plan (shared prefixes, per-sequence prefill
    segments, batched decode); the triton backend needs only the tensors.
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
        _build_cpu_plan(meta, [list(t) for t in block_tables], device)
    return meta
