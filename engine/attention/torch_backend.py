"""Torch attention over the paged KV cache: the CPU path (also correct on CUDA, via math).

Per layer: write the new K/V by slot; a shared prefix of a group of sequences is attended once
with all the group's queries stacked; then each sequence's remaining keys (prefill: one call per
sequence; decode: one call for all) and the two parts are merged by log-sum-exp.
GQA is folded into the query dims ([.., Hkv, G, L, D]) so K/V are never repeated per head.
With the native kernels (engine/attention/native.py) decode tokens, and prefill chunks where
the CPU has a prefill kernel for the dtype, are attended by them instead, reading each
sequence's keys in place.
"""

from __future__ import annotations

import torch
from torch._C._autograd import _profiler_enabled
from torch.profiler import record_function

from engine.attention.metadata import AttentionMetadata
from engine.attention.native import NativeKernels
from engine.attention.torch_plan import (
    BlockRun,
    CausalBatch,
    DecodePlan,
    NativeDecode,
    PrefillSegment,
    SharedPrefix,
    TorchPlan,
    build_torch_plan,
)


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots
) -> None:
    """k/v [T, Hkv, D] -> caches [num_blocks, bs, Hkv, D] at flat slots [T]."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    # cache [num_blocks, bs, Hkv, D] -> [len(block_ids) * bs, Hkv, D]
    return cache.index_select(0, block_ids).flatten(0, 1)


def _keys(cache: torch.Tensor, run: BlockRun) -> torch.Tensor:
    """[num_blocks * bs, Hkv, D]: a view when the blocks are consecutive, else a gather."""
    if run.span is not None:
        return cache[run.span[0] : run.span[1]].flatten(0, 1)
    return _gather(cache, run.ids)


def _math_attention(q, k, v, mask, causal, scale):
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    if mask is not None:
        s = s + mask.float()
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v.float()).to(q.dtype), lse


def attend(q, k, v, mask, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, Lq, D], k/v [B, H, Lk, D] (any strides) -> (out [B, H, Lq, D], lse [B, H, Lq])."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, is_causal=causal, attn_mask=mask, scale=scale
        )
        return out, lse
    return _math_attention(q, k, v, mask, causal, scale)


def merge(o1, lse1, o2, lse2) -> torch.Tensor:
    """Combine attention over two disjoint key sets: o [R, H, D], lse [R, H] (float32)."""
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
    total = w1 + w2
    return ((o1 * (w1 / total).unsqueeze(-1)) + (o2 * (w2 / total).unsqueeze(-1))).to(o1.dtype)


class TorchAttention:
    """native: the compiled kernels (load_native()), or None for the pure-torch path.
    native_prefill: prefill chunks go to the native kernel too (see make_attention_backend).
    invariant: decode tokens as well (batch- and cache-invariant attention, build_torch_plan)."""

    def __init__(
        self,
        native: NativeKernels | None = None,
        native_prefill: bool = False,
        invariant: bool = False,
    ) -> None:
        if native_prefill and native is None:
            raise ValueError("native_prefill needs the native kernels")
        if invariant and not native_prefill:
            raise ValueError("invariant attention needs the native prefill kernel")
        self.native = native
        self.native_prefill = native_prefill
        self.invariant = invariant

    def plan(self, meta: AttentionMetadata) -> TorchPlan:
        return build_torch_plan(meta, self.native is not None, self.native_prefill, self.invariant)

    def _windowed(self, plan: TorchPlan, window: int | None) -> tuple[TorchPlan, int | None]:
        """The plan of a layer with this window (built once per step and window), and the window
        the kernels still need (None where every key of the step lies within it)."""
        if window is None or plan.meta is None or window >= plan.meta.max_seqlen_k:
            return plan, None
        if window not in plan.windowed:
            plan.windowed[window] = build_torch_plan(
                plan.meta, self.native is not None, self.native_prefill, self.invariant, window
            )
        return plan.windowed[window], window

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: TorchPlan,
        scale: float,
        window: int | None = None,
        kv_stored: bool = False,
    ) -> torch.Tensor:
        """kv_stored: k and v are in the caches already (RowOps.rope_store_kv wrote them)."""
        if window is not None and window < 1:
            raise ValueError(f"sliding window must be at least 1, got {window}")
        plan, window = self._windowed(plan, window)
        if not kv_stored:
            write_kv(k, v, k_cache, v_cache, plan.slot_mapping)
        if not _profiler_enabled():  # a range costs as much as a small op: only when read
            return self._forward(q, k, v, k_cache, v_cache, plan, scale, window)
        with record_function("attention"):
            return self._forward(q, k, v, k_cache, v_cache, plan, scale, window)

    def _forward(self, q, k, v, k_cache, v_cache, plan: TorchPlan, scale: float, window):
        # q [T, Hq, D], k/v [T, Hkv, D] (in the caches already) -> [T, Hq, D]; the plan is the
        # window's (_windowed)
        if plan.decode_only:  # the kernel's output is the whole result
            return self._native_decode(q, k_cache, v_cache, plan.decode, scale, None, window)
        t, hq, _ = q.shape
        out = torch.empty_like(q)
        lse = torch.empty(t, hq, dtype=torch.float32, device=q.device) if plan.shared else None
        for batch in plan.causal:
            self._causal(q, k, v, batch, scale, out, lse)
        for seg in plan.prefills:
            o, seg_lse = self._prefill(q, k_cache, v_cache, seg, scale)
            out[seg.start : seg.end] = o
            if lse is not None:
                lse[seg.start : seg.end] = seg_lse
        if plan.native_prefill is not None:
            p = plan.native_prefill
            self.native.paged_prefill(
                q,
                k_cache,
                v_cache,
                out,
                p.q_starts,
                p.q_lens,
                p.seq_lens,
                p.block_tables,
                scale,
                window,
            )
        if isinstance(plan.decode, NativeDecode):
            self._native_decode(q, k_cache, v_cache, plan.decode, scale, out, window)
        elif plan.decode is not None:
            self._decode(q, k_cache, v_cache, plan.decode, scale, out, lse)
        for group in plan.shared:
            o, group_lse = self._shared(q, k_cache, v_cache, group, scale)
            rows = group.rows
            merged = merge(o, group_lse, out.index_select(0, rows), lse.index_select(0, rows))
            out.index_copy_(0, rows, merged)
        return out

    @staticmethod
    def _causal(q, k, v, batch: CausalBatch, scale: float, out, lse) -> None:
        n, length, (_, hq, d), hkv = batch.n, batch.length, q.shape, k.shape[1]
        rows = batch.rows
        qs, ks, vs = (x[rows] for x in (q, k, v))
        # GQA folded into the batch: q [n * Hkv, G, L, D]; k/v [n * Hkv, G (stride 0), L, D]
        qs = qs.view(n, length, hkv, -1, d).permute(0, 2, 3, 1, 4).reshape(n * hkv, -1, length, d)
        ks = ks.view(n, length, hkv, d).transpose(1, 2).reshape(n * hkv, 1, length, d)
        vs = vs.view(n, length, hkv, d).transpose(1, 2).reshape(n * hkv, 1, length, d)
        group = qs.shape[1]
        ks, vs = ks.expand(-1, group, -1, -1), vs.expand(-1, group, -1, -1)
        o, o_lse = attend(qs, ks, vs, None, True, scale)
        o = o.reshape(n, hq, length, d).transpose(1, 2).reshape(n * length, hq, d)
        out[rows] = o
        if lse is not None:
            lse[rows] = o_lse.reshape(n, hq, length).transpose(1, 2).reshape(n * length, hq)

    @staticmethod
    def _prefill(q, k_cache, v_cache, seg: PrefillSegment, scale: float):
        hkv, d = k_cache.shape[2], k_cache.shape[3]
        length = seg.end - seg.start
        qs = q[seg.start : seg.end].permute(1, 0, 2).unflatten(0, (hkv, -1))  # [Hkv, G, L, D]
        n = seg.ctx_len - seg.key_start
        offset = seg.key_start % k_cache.shape[1]
        ks = _keys(k_cache, seg.blocks)[offset : offset + n]
        vs = _keys(v_cache, seg.blocks)[offset : offset + n]
        group = qs.shape[1]
        ks = ks.permute(1, 0, 2).unsqueeze(1).expand(hkv, group, -1, d)  # GQA: stride-0 expand
        vs = vs.permute(1, 0, 2).unsqueeze(1).expand(hkv, group, -1, d)
        o, lse = attend(qs, ks, vs, seg.mask.to(q.dtype), False, scale)
        # o [Hkv, G, L, D] -> [L, Hq, D]; lse [Hkv, G, L] -> [L, Hq]
        return o.flatten(0, 1).transpose(0, 1), lse.reshape(-1, length).transpose(0, 1)

    @staticmethod
    def _decode(q, k_cache, v_cache, plan: DecodePlan, scale: float, out, lse) -> None:
        qd = q[plan.row_slice] if plan.row_slice is not None else q.index_select(0, plan.rows)
        b, hq, d = qd.shape
        hkv = k_cache.shape[2]
        ks = _gather(k_cache, plan.block_ids).view(b, -1, hkv, d).transpose(1, 2)
        vs = _gather(v_cache, plan.block_ids).view(b, -1, hkv, d).transpose(1, 2)
        # the G query heads of a kv head are the query rows of one attention: [B, Hkv, G, D]
        o, o_lse = attend(qd.view(b, hkv, -1, d), ks, vs, plan.mask.to(q.dtype), False, scale)
        o, o_lse = o.reshape(b, hq, d), o_lse.reshape(b, hq)
        if plan.row_slice is not None:
            out[plan.row_slice] = o
            if lse is not None:
                lse[plan.row_slice] = o_lse
        else:
            out.index_copy_(0, plan.rows, o)
            if lse is not None:
                lse.index_copy_(0, plan.rows, o_lse)

    def _native_decode(
        self, q, k_cache, v_cache, plan: NativeDecode, scale: float, out, window
    ) -> torch.Tensor:
        """The decode rows' attention, into out's rows (out None: returned as it is)."""
        qd = q[plan.row_slice] if plan.row_slice is not None else q.index_select(0, plan.rows)
        o = self.native.paged_decode(
            qd, k_cache, v_cache, plan.block_tables, plan.seq_lens, scale, plan.shared, window
        )
        if out is None:
            return o
        if plan.row_slice is not None:
            out[plan.row_slice] = o
        else:
            out.index_copy_(0, plan.rows, o)
        return out

    @staticmethod
    def _shared(q, k_cache, v_cache, group: SharedPrefix, scale: float):
        hkv, d = k_cache.shape[2], k_cache.shape[3]
        qr = q.index_select(0, group.rows)  # [R, Hq, D]
        r = qr.shape[0]
        # every row attends every prefix key: stack rows x G query heads as one query sequence
        qs = qr.view(r, hkv, -1, d).transpose(0, 1).reshape(1, hkv, -1, d)  # [1, Hkv, R*G, D]
        ks = _keys(k_cache, group.blocks).permute(1, 0, 2).unsqueeze(0)  # [1, Hkv, P, D]
        vs = _keys(v_cache, group.blocks).permute(1, 0, 2).unsqueeze(0)
        o, lse = attend(qs, ks, vs, None, False, scale)
        o = o.view(hkv, r, -1, d).transpose(0, 1).reshape(r, -1, d)  # [R, Hq, D]
        return o, lse.view(hkv, r, -1).transpose(0, 1).reshape(r, -1)
