"""The torch backend's per-step plan: which rows attend which keys, and how they are batched.

Built once per step from the backend-neutral AttentionMetadata and read by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

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
    """Every decode row (_decode_rows), batched (torch path): its keys [key_start, its len)
    gathered (from key_start's block) to [B, num_blocks * bs] and masked."""

    rows: torch.Tensor  # int64 [B]: rows of q
    row_slice: slice | None  # the same rows as a slice when they are contiguous
    block_ids: torch.Tensor  # int64 [B * num_blocks]
    num_blocks: int
    mask: AdditiveMask  # [B, 1, 1, num_blocks * bs]


@dataclass
class NativeDecode:
    """Every decode row (_decode_rows), for the native kernel: it reads each row's keys in place
    through its sequence's block table (no gather, no mask); the keys of cached leading blocks
    that several sequences share are read once for the group (`shared`: all their rows)."""

    rows: torch.Tensor  # int64 [B]: rows of q
    row_slice: slice | None  # the same rows as a slice when they are contiguous
    block_tables: torch.Tensor  # int32 [B, max_blocks]: each row's sequence's
    seq_lens: torch.Tensor  # int32 [B]: keys [0, seq_len) of each row
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

    @cached_property
    def decode_only(self) -> bool:
        """Every row of the step is a native decode row, in order (the kernel's output is the
        whole result)."""
        d = self.decode
        return (
            isinstance(d, NativeDecode)
            and d.row_slice == slice(0, len(self.slot_mapping))
            and not (self.shared or self.causal or self.prefills or self.native_prefill)
        )


def _shared_prefixes(
    candidates: list[int],
    query_lens: list[int],
    seq_lens: list[int],
    tables: list[list[int]],
    bs: int,
) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """(shared tokens per sequence, [(member sequences, shared block ids)]).

    The candidate sequences are grouped by their first block; a group shares the longest common
    run of leading blocks that lies wholly before every member's first new token."""
    by_first: dict[int, list[int]] = {}
    for b in candidates:
        if (seq_lens[b] - query_lens[b]) // bs >= MIN_SHARED_BLOCKS:
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


def _decode_sequences(meta: AttentionMetadata) -> list[int]:
    """The sequences whose rows are decode steps: one new token, or a speculative verify."""
    return [b for b, n in enumerate(meta.query_lens) if n == 1 or meta.verify[b]]


def _decode_rows(
    decodes: list[int], cu: np.ndarray, seq_lens: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows of q, each row's sequence, each row's keys) of the decode sequences, int64 [N] each:
    row j of a sequence with L new tokens and seq_len S is the decode step of keys [0, S - L + j
    + 1), so a verify row gets the arithmetic of the plain decode step at its position."""
    b = np.asarray(decodes, dtype=np.int64)
    seqs = np.repeat(b, cu[b + 1] - cu[b])
    rows = np.concatenate([np.arange(cu[i], cu[i + 1]) for i in decodes])
    return rows, seqs, np.asarray(seq_lens, dtype=np.int64)[seqs] - (cu[seqs + 1] - rows) + 1


def _rows_slice(rows: np.ndarray) -> slice | None:
    """rows as a slice when they are contiguous (they are increasing)."""
    return slice(int(rows[0]), int(rows[-1]) + 1) if rows[-1] - rows[0] == len(rows) - 1 else None


def _decode_plan(rows, seqs, lens, key_starts, tables, bs, device) -> DecodePlan:
    # gathered from key_start's block: keys [key_start, len) of row i sit at [off, off + n)
    off, n = key_starts % bs, lens - key_starts
    nb = int(-(-(off + n).max() // bs))
    table = np.zeros((len(rows), nb), dtype=np.int64)
    for i, (b, start) in enumerate(zip(seqs, key_starts, strict=True)):
        blocks = tables[b][start // bs : start // bs + nb]
        table[i, : len(blocks)] = blocks
    index = torch.arange(nb * bs)[None, :]
    allowed = (index >= torch.from_numpy(off)[:, None]) & (
        index < torch.from_numpy(off + n)[:, None]
    )
    mask = AdditiveMask.from_bool(allowed.view(len(rows), 1, 1, nb * bs))
    mask.float32 = mask.float32.to(device)
    return DecodePlan(
        rows=torch.from_numpy(rows).to(device),
        row_slice=_rows_slice(rows),
        block_ids=torch.from_numpy(table.reshape(-1)).to(device),
        num_blocks=nb,
        mask=mask,
    )


def _native_decode(decodes, cu, meta: AttentionMetadata, device, share: bool) -> NativeDecode:
    """share: group sequences by shared leading blocks, each member with all its rows (never
    under a window: a shared prefix is attended whole)."""
    rows, seqs, lens = _decode_rows(decodes, cu, meta.seq_lens_list)
    shared = None
    if share:
        _, groups = _shared_prefixes(
            decodes, meta.query_lens, meta.seq_lens_list, meta.block_tables_list, meta.block_size
        )
        if groups:
            rows_of = [np.flatnonzero(np.isin(seqs, members)) for members, _ in groups]
            members = np.concatenate(rows_of)
            shared = SharedDecodeGroups(
                offsets=torch.from_numpy(
                    np.cumsum([0] + [len(r) for r in rows_of], dtype=np.int32)
                ),
                members=torch.from_numpy(members.astype(np.int32)),
                blocks=torch.tensor([len(blocks) for _, blocks in groups], dtype=torch.int32),
            )
    return NativeDecode(
        rows=torch.from_numpy(rows).to(device),
        row_slice=_rows_slice(rows),
        block_tables=meta.block_tables.index_select(0, torch.from_numpy(seqs).to(device)),
        seq_lens=torch.from_numpy(lens.astype(np.int32)).to(device),
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
    """Decode rows (_decode_rows: one-token sequences and every row of a speculative verify)
    are attended as decode steps, the others as prefill chunks.
    native_decode: decode rows go to the native kernel (all their keys, in place; it reads a
    shared prefix once per group); otherwise they are batched, gathered and masked in torch, and
    take no part in shared-prefix groups either way.
    native_prefill: so do the prefill chunks (the prefill kernel).
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
            decodes = _decode_sequences(meta)
            prefills = [b for b, n in enumerate(query_lens) if n > 1 and not meta.verify[b]]
        if prefills:
            plan.native_prefill = _native_prefill(prefills, cu, meta, device)
        if decodes:
            plan.decode = _native_decode(decodes, cu, meta, device, share=window is None)
        return plan
    decodes = _decode_sequences(meta)
    is_decode = set(decodes)
    if window is None:
        # decode rows are attended alone here, every key in one pass (a shared prefix's separate
        # softmax would make a row's bits depend on who shares it); the native kernel groups its
        # own by whole parts, which keeps them
        grouped = [b for b, n in enumerate(query_lens) if n and b not in is_decode]
        key_starts, groups = _shared_prefixes(grouped, query_lens, seq_lens, tables, bs)
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
    causal_starts: dict[int, list[int]] = {}
    for b, (qlen, slen) in enumerate(zip(query_lens, seq_lens, strict=True)):
        if b in is_decode:
            continue
        if qlen > 1 and slen - key_starts[b] == qlen and window is None:
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
        rows, seqs, lens = _decode_rows(decodes, cu, seq_lens)
        # a row's keys: after its group's shared prefix, or from its own window start
        starts = np.asarray(key_starts)[seqs] if window is None else np.maximum(0, lens - window)
        plan.decode = _decode_plan(rows, seqs, lens, starts, tables, bs, device)
    return plan
