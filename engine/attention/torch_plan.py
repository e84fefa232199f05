"""The torch backend's per-step plan: which rows attend which keys, and how they are batched.

Built once per step from the backend-neutral AttentionMetadata and read by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.native import SharedDecodeGroups

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
    [start, end) attend keys [key_start, ctx_len) (keys [0, key_start) via its SharedPrefix, or
    before the first row's sliding window)."""

    start: int
    end: int
    key_start: int
    ctx_len: int
    blocks: BlockRun  # blocks holding keys [key_start, ctx_len)
    mask: AdditiveMask  # [L, ctx_len - key_start] causal with offset (and windowed)


@dataclass
class DecodePlan:
    """Every sequence with exactly one new token, batched (torch path): its keys
    [key_start, seq_len) gathered (from key_start's block) to [B, num_blocks * bs] and masked."""

    rows: torch.Tensor  # int64 [B]: rows of q
    row_slice: slice | None  # the same rows as a slice when they are contiguous
    block_ids: torch.Tensor  # int64 [B * num_blocks]
    num_blocks: int
    mask: AdditiveMask  # [B, 1, 1, num_blocks * bs]


@dataclass
class NativeDecode:
    """Every sequence with exactly one new token, for the native kernel: it reads each sequence's
    keys in place through its block table (no gather, no mask); the keys of cached leading blocks
    that several sequences share are read once for the group (`shared`)."""

    rows: torch.Tensor  # int64 [B]: rows of q
    row_slice: slice | None  # the same rows as a slice when they are contiguous
    block_tables: torch.Tensor  # int32 [B, max_blocks]
    seq_lens: torch.Tensor  # int32 [B]
    shared: SharedDecodeGroups | None = None


@dataclass
class NativePrefill:
    """Every sequence with more than one new token, for the native prefill kernel: each attends all
    its keys (cached and new, causal) in place through its block table."""

    q_starts: torch.Tensor  # int32 [N]
    q_lens: torch.Tensor  # int32 [N]
    seq_lens: torch.Tensor  # int32 [N]
    block_tables: torch.Tensor  # int32 [N, max_blocks]


@dataclass
class TorchPlan:
    """The torch backend's view of one step, built once from the metadata and read by every
    layer: shared prefixes, batched fresh prefills, per-sequence prefill segments, decode."""

    slot_mapping: torch.Tensor  # int64 [T]
    shared: list[SharedPrefix] = field(default_factory=list)
    causal: list[CausalBatch] = field(default_factory=list)
    prefills: list[PrefillSegment] = field(default_factory=list)
    decode: DecodePlan | NativeDecode | None = None
    native_prefill: NativePrefill | None = None
    meta: AttentionMetadata | None = None  # what it was built from
    windowed: dict[int, TorchPlan] = field(default_factory=dict)  # window -> its plan (lazy)


def _shared_prefixes(
    query_lens: list[int],
    seq_lens: list[int],
    tables: list[list[int]],
    bs: int,
    min_query_len: int,
) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """(shared tokens per sequence, [(member sequences, shared block ids)]).

    Sequences with at least min_query_len new tokens are grouped by their first block; a group
    shares the longest common run of leading blocks that lies wholly before every member's first
    new token."""
    by_first: dict[int, list[int]] = {}
    for b, (qlen, slen) in enumerate(zip(query_lens, seq_lens, strict=True)):
        if qlen >= min_query_len and (slen - qlen) // bs >= MIN_SHARED_BLOCKS:
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


def _prefill_segment(start, qlen, slen, key_start, blocks, bs, device, window) -> PrefillSegment:
    first, last = key_start // bs, -(-slen // bs)
    key_pos = torch.arange(key_start, slen)[None, :]
    query_pos = torch.arange(slen - qlen, slen)[:, None]
    allowed = key_pos <= query_pos
    if window is not None:
        allowed &= key_pos > query_pos - window
    mask = AdditiveMask.from_bool(allowed)
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
    # gathered from key_start's block: keys [key_start, seq_len) sit at [off, off + lens)
    off = np.asarray([key_starts[b] % bs for b in decodes])
    lens = np.asarray([seq_lens[b] - key_starts[b] for b in decodes])
    nb = int(-(-(off + lens).max() // bs))
    table = np.zeros((len(decodes), nb), dtype=np.int64)
    for i, b in enumerate(decodes):
        blocks = tables[b][key_starts[b] // bs : key_starts[b] // bs + nb]
        table[i, : len(blocks)] = blocks
    contiguous = token_rows[-1] - token_rows[0] == len(decodes) - 1
    index = torch.arange(nb * bs)[None, :]
    allowed = (index >= torch.from_numpy(off)[:, None]) & (
        index < torch.from_numpy(off + lens)[:, None]
    )
    mask = AdditiveMask.from_bool(allowed.view(len(decodes), 1, 1, nb * bs))
    mask.float32 = mask.float32.to(device)
    return DecodePlan(
        rows=torch.from_numpy(token_rows).to(device),
        row_slice=slice(int(token_rows[0]), int(token_rows[-1]) + 1) if contiguous else None,
        block_ids=torch.from_numpy(table.reshape(-1)).to(device),
        num_blocks=nb,
        mask=mask,
    )


def _native_decode(decodes, cu, meta: AttentionMetadata, device, share: bool) -> NativeDecode:
    """share: group sequences by shared leading blocks (never under a window: a shared prefix
    is attended whole)."""
    token_rows = cu[decodes]
    contiguous = token_rows[-1] - token_rows[0] == len(decodes) - 1
    index = torch.from_numpy(np.asarray(decodes, dtype=np.int64)).to(device)
    seq_lens = [meta.seq_lens_list[b] for b in decodes]
    tables = [meta.block_tables_list[b] for b in decodes]
    groups = []
    if share:
        _, groups = _shared_prefixes([1] * len(decodes), seq_lens, tables, meta.block_size, 1)
    shared = None
    if groups:
        offsets = np.cumsum([0] + [len(members) for members, _ in groups], dtype=np.int32)
        shared = SharedDecodeGroups(
            offsets=torch.from_numpy(offsets),
            members=torch.tensor([b for members, _ in groups for b in members], dtype=torch.int32),
            blocks=torch.tensor([len(blocks) for _, blocks in groups], dtype=torch.int32),
        )
    return NativeDecode(
        rows=torch.from_numpy(token_rows).to(device),
        row_slice=slice(int(token_rows[0]), int(token_rows[-1]) + 1) if contiguous else None,
        block_tables=meta.block_tables.index_select(0, index),
        seq_lens=meta.seq_lens.index_select(0, index),
        shared=shared,
    )


def _native_prefill(prefills: list[int], cu, meta: AttentionMetadata, device) -> NativePrefill:
    index = torch.from_numpy(np.asarray(prefills, dtype=np.int64)).to(device)
    lens = np.asarray([meta.query_lens[b] for b in prefills], dtype=np.int32)
    return NativePrefill(
        q_starts=torch.from_numpy(cu[prefills].astype(np.int32)).to(device),
        q_lens=torch.from_numpy(lens).to(device),
        seq_lens=meta.seq_lens.index_select(0, index),
        block_tables=meta.block_tables.index_select(0, index),
    )


def build_torch_plan(
    meta: AttentionMetadata,
    native_decode: bool,
    native_prefill: bool = False,
    invariant: bool = False,
    window: int | None = None,
) -> TorchPlan:
    """native_decode: decode tokens go to the native kernel (all their keys, in place) and take
    no part in shared-prefix groups; otherwise they are batched, gathered and masked in torch.
    native_prefill: so do the sequences with more than one new token (the prefill kernel).
    invariant (with native_prefill): every token goes to the prefill kernel, whose per-query sums
    run over fixed 64-key tiles from position 0: a token's attention is then the same bits
    whether it was decoded, prefilled in any chunk, or is the one uncached token of a hit.
    window: the plan of a sliding-window layer (the native kernels take the window; the torch
    path attends each sequence's keys from its first row's window start, masked): no shared
    prefixes, no batched fresh prefills."""
    query_lens, seq_lens, bs = meta.query_lens, meta.seq_lens_list, meta.block_size
    tables, device = meta.block_tables_list, meta.slot_mapping.device
    plan = TorchPlan(meta.slot_mapping, meta=meta)
    if native_prefill:
        cu = np.zeros(len(query_lens) + 1, dtype=np.int64)
        np.cumsum(query_lens, out=cu[1:])
        if invariant:  # every sequence through the prefill kernel, one-token steps included
            decodes, prefills = [], list(range(len(query_lens)))
        else:
            decodes = [b for b, n in enumerate(query_lens) if n == 1]
            prefills = [b for b, n in enumerate(query_lens) if n > 1]
        if prefills:
            plan.native_prefill = _native_prefill(prefills, cu, meta, device)
        if decodes:
            plan.decode = _native_decode(decodes, cu, meta, device, share=window is None)
        return plan
    if window is None:
        key_starts, groups = _shared_prefixes(
            query_lens, seq_lens, tables, bs, min_query_len=2 if native_decode else 1
        )
    else:  # keys before the first new token's window are never read
        key_starts = [max(0, s - q - window + 1) for q, s in zip(query_lens, seq_lens, strict=True)]
        groups = []
    cu = np.zeros(len(query_lens) + 1, dtype=np.int64)
    np.cumsum(query_lens, out=cu[1:])
    for members, blocks in groups:
        rows = np.concatenate([np.arange(cu[b], cu[b + 1]) for b in members])
        plan.shared.append(
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
        elif qlen > 1 and slen - key_starts[b] == qlen and window is None:
            causal_starts.setdefault(qlen, []).append(int(cu[b]))  # its only keys: its new tokens
        elif qlen > 1:
            seg = _prefill_segment(
                int(cu[b]), qlen, slen, key_starts[b], tables[b], bs, device, window
            )
            plan.prefills.append(seg)
    plan.causal = _causal_batches(causal_starts, device)
    if decodes and native_decode:
        plan.decode = _native_decode(decodes, cu, meta, device, share=window is None)
    elif decodes:
        plan.decode = _decode_plan(decodes, cu, seq_lens, key_starts, tables, bs, device)
    return plan
