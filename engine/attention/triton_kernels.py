"""Triton kernels (CUDA; also run by the CPU interpreter with TRITON_INTERPRET=1 in tests):
store K/V by slot, and paged attention of new tokens over cached prefix + themselves.

Caches are [num_blocks, block_size, Hkv, D] with contiguous rows: a slot is Hkv * D values.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_k,
    stride_v,
    ROW: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < ROW
    k = tl.load(k_ptr + t * stride_k + offs, mask=mask)
    v = tl.load(v_ptr + t * stride_v + offs, mask=mask)
    tl.store(k_cache_ptr + slot * ROW + offs, k, mask=mask)
    tl.store(v_cache_ptr + slot * ROW + offs, v, mask=mask)


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    cu_q_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    scale,
    window,  # sliding window (keys kv_idx > q_idx - window); 0: all keys
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
):
    # one program: BLOCK_M new tokens of sequence b, query head h
    mb = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    q_start = tl.load(cu_q_ptr + b)
    q_len = tl.load(cu_q_ptr + b + 1) - q_start
    if mb * BLOCK_M < q_len:
        ctx = tl.load(seq_lens_ptr + b)
        kvh = h // GROUP
        offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = offs_m < q_len
        d_mask = offs_d < HEAD_DIM
        q_rows = (q_start + offs_m).to(tl.int64)
        q_off = q_rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
        q = tl.load(q_ptr + q_off, mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        q_pos = ctx - q_len + offs_m  # absolute positions of these rows
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # keys [kv_first, kv_end): what the rows of this block may see (kv_first: the first
        # row's window start; keys before it are not read), in tiles from kv_start
        kv_end = tl.minimum(ctx, ctx - q_len + (mb + 1) * BLOCK_M)
        kv_first = tl.where(window > 0, tl.maximum(ctx - q_len + mb * BLOCK_M - window + 1, 0), 0)
        kv_start = kv_first // BLOCK_N * BLOCK_N
        row = NUM_KV_HEADS * HEAD_DIM
        for n in range(kv_start, kv_end, BLOCK_N):
            offs_n = n + tl.arange(0, BLOCK_N)
            n_mask = (offs_n < kv_end) & (offs_n >= kv_first)
            blk = tl.load(
                block_tables_ptr + b * stride_bt + offs_n // BLOCK_SIZE, mask=n_mask, other=0
            )
            slot = blk.to(tl.int64) * BLOCK_SIZE + offs_n % BLOCK_SIZE
            kv_off = slot[:, None] * row + kvh * HEAD_DIM + offs_d[None, :]
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
            if IEEE:  # noqa: SIM108 (constexpr branch)
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * scale
            allowed = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
            allowed = allowed & ((offs_n[None, :] > q_pos[:, None] - window) | (window == 0))
            s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
            if IEEE:  # noqa: SIM108 (constexpr branch)
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_off = q_rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
        tl.store(
            out_ptr + o_off,
            acc.to(out_ptr.dtype.element_ty),
            mask=m_mask[:, None] & d_mask[None, :],
        )


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[T, H, D] with each token's H * D values contiguous (a view when they already are)."""
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.contiguous()


def store_kv(k, v, k_cache, v_cache, slot_mapping: torch.Tensor) -> None:
    """k/v [T, Hkv, D] -> caches [num_blocks, bs, Hkv, D] at flat slots [T]."""
    k, v = _rows(k), _rows(v)
    t, hkv, d = k.shape
    if t == 0:
        return
    row = hkv * d
    _store_kv_kernel[(t,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        v.stride(0),
        row,
        triton.next_power_of_2(row),
    )


def paged_attention(
    q, k_cache, v_cache, out, meta, scale: float, window: int | None = None
) -> None:
    """out [T, Hq, D] <- attention of q [T, Hq, D] over each sequence's cached keys (causal);
    window W: the row at position p attends keys [max(0, p - W + 1), p] only."""
    if window is not None and window < 1:
        raise ValueError(f"sliding window must be at least 1, got {window}")
    q = _rows(q)
    t, hq, d = q.shape
    num_seqs = meta.seq_lens.shape[0]
    if t == 0 or num_seqs == 0:
        return
    hkv = k_cache.shape[2]
    wide = d > 128  # head dim 256 (Gemma 3): half the tiles, so q/k/v tiles fit shared memory
    block_m = 16 if meta.max_seqlen_q <= 16 else (32 if wide else 64)
    grid = (triton.cdiv(meta.max_seqlen_q, block_m), num_seqs, hq)
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        meta.cu_seqlens_q,
        meta.seq_lens,
        meta.block_tables,
        scale,
        window or 0,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        meta.block_tables.stride(0),
        NUM_KV_HEADS=hkv,
        GROUP=hq // hkv,
        HEAD_DIM=d,
        BLOCK_D=max(16, triton.next_power_of_2(d)),  # tl.dot needs K >= 16 on GPUs
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_M=block_m,
        BLOCK_N=32 if wide else 64,
        IEEE=q.dtype == torch.float32,
    )
