"""Triton kernels (CUDA; also run by the CPU interpreter with TRITON_INTERPRET=1 in tests):
store K/V by slot, and paged attention of new tokens over cached prefix + themselves.

Caches are [num_blocks, block_size, Hkv, D] with contiguous rows: a slot is Hkv * D values; or,
for a quantized format (engine/kv/quant.py), uint8 [num_blocks, block_size, Hkv, D + 4]: each
head's D codes then its float32 scale. Stores quantize; attention reads the codes and scales
(dequantizing in registers, never into a copy of the cache).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton_quant import (
    NOT_QUANTIZED,
    code_values,
    load_scales,
    quantize_store,
)
from engine.kv.quant import SCALE_BYTES, KVFormat


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
def _store_kv_quantized_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_k,
    stride_v,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FORMAT: tl.constexpr,
    QMAX: tl.constexpr,
):
    # one program per token: its Hkv rows of k and of v, quantized and packed at its slot
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = offs_h < NUM_KV_HEADS
    mask = h_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
    src = offs_h[:, None] * HEAD_DIM + offs_d[None, :]
    packed = HEAD_DIM + 4
    rows = slot * (NUM_KV_HEADS * packed) + offs_h * packed
    k = tl.load(k_ptr + t * stride_k + src, mask=mask, other=0.0).to(tl.float32)
    quantize_store(k_cache_ptr, rows, h_mask, offs_d, k, FORMAT, QMAX, HEAD_DIM)
    v = tl.load(v_ptr + t * stride_v + src, mask=mask, other=0.0).to(tl.float32)
    quantize_store(v_cache_ptr, rows, h_mask, offs_d, v, FORMAT, QMAX, HEAD_DIM)


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
    HEAD_STRIDE: tl.constexpr,  # a cache row's length per head: HEAD_DIM, or HEAD_DIM + 4 packed
    FORMAT: tl.constexpr,  # KVFormat.code of a quantized cache; NOT_QUANTIZED (-1)
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
        row = NUM_KV_HEADS * HEAD_STRIDE
        for n in range(kv_start, kv_end, BLOCK_N):
            offs_n = n + tl.arange(0, BLOCK_N)
            n_mask = (offs_n < kv_end) & (offs_n >= kv_first)
            blk = tl.load(
                block_tables_ptr + b * stride_bt + offs_n // BLOCK_SIZE, mask=n_mask, other=0
            )
            slot = blk.to(tl.int64) * BLOCK_SIZE + offs_n % BLOCK_SIZE
            head = slot * row + kvh * HEAD_STRIDE  # [BLOCK_N]: where each key's head starts
            kv_off = head[:, None] + offs_d[None, :]
            kv_mask = n_mask[:, None] & d_mask[None, :]
            if FORMAT < 0:  # not quantized
                k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
            else:  # code values are exact in q's dtype; each key's scale multiplies its score
                k = code_values(tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0), FORMAT)
                k = k.to(q.dtype)
            if IEEE:  # noqa: SIM108 (constexpr branch)
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * scale
            if FORMAT >= 0:
                s = s * load_scales(k_cache_ptr, head, n_mask, HEAD_DIM)[None, :]
            allowed = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
            allowed = allowed & ((offs_n[None, :] > q_pos[:, None] - window) | (window == 0))
            s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            if FORMAT < 0:  # not quantized
                v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
            else:  # dequantized as the reference does: code value * scale, rounded to q's dtype
                v = code_values(tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0), FORMAT)
                v = v * load_scales(v_cache_ptr, head, n_mask, HEAD_DIM)[:, None]
                v = v.to(q.dtype)
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


def check_packed(head_dim: int, kv_format: KVFormat | None) -> None:
    """Quantized rows' scales are read and written as float32: 4-byte aligned."""
    if kv_format is not None and head_dim % SCALE_BYTES:
        raise ValueError(f"{kv_format.name} KV on CUDA needs a head_dim divisible by 4")


def format_code(kv_format: KVFormat | None) -> int:
    return NOT_QUANTIZED if kv_format is None else kv_format.code


def store_kv(
    k, v, k_cache, v_cache, slot_mapping: torch.Tensor, kv_format: KVFormat | None = None
) -> None:
    """k/v [T, Hkv, D] -> caches [num_blocks, bs, Hkv, D] at flat slots [T]; kv_format: the
    caches are uint8 [num_blocks, bs, Hkv, D + 4] and each row is quantized on its way in."""
    k, v = _rows(k), _rows(v)
    t, hkv, d = k.shape
    if t == 0:
        return
    if kv_format is not None:
        check_packed(d, kv_format)
        _store_kv_quantized_kernel[(t,)](
            k,
            v,
            k_cache,
            v_cache,
            slot_mapping,
            k.stride(0),
            v.stride(0),
            NUM_KV_HEADS=hkv,
            HEAD_DIM=d,
            BLOCK_H=triton.next_power_of_2(hkv),
            BLOCK_D=triton.next_power_of_2(d),
            FORMAT=kv_format.code,
            QMAX=kv_format.qmax,
        )
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
    q,
    k_cache,
    v_cache,
    out,
    meta,
    scale: float,
    window: int | None = None,
    kv_format: KVFormat | None = None,
) -> None:
    """out [T, Hq, D] <- attention of q [T, Hq, D] over each sequence's cached keys (causal);
    window W: the row at position p attends keys [max(0, p - W + 1), p] only. kv_format: the
    caches hold packed rows of that format (uint8 [.., Hkv, D + 4])."""
    if window is not None and window < 1:
        raise ValueError(f"sliding window must be at least 1, got {window}")
    q = _rows(q)
    t, hq, d = q.shape
    num_seqs = meta.seq_lens.shape[0]
    if t == 0 or num_seqs == 0:
        return
    check_packed(d, kv_format)
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
        HEAD_STRIDE=k_cache.shape[3],
        FORMAT=format_code(kv_format),
        BLOCK_D=max(16, triton.next_power_of_2(d)),  # tl.dot needs K >= 16 on GPUs
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_M=block_m,
        BLOCK_N=32 if wide else 64,
        IEEE=q.dtype == torch.float32,
    )
