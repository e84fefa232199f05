"""A layer's small row-wise ops as fused triton kernels (CUDA; also run by the CPU interpreter with
TRITON_INTERPRET=1 in tests): RMSNorm, RMSNorm after the residual add, SiLU times the up
projection, and rope with the K/V cache write (quantizing it for a quantized pool). Same
signatures as engine/models/row_ops.py's RowOps, whose torch versions are the references;
statistics and products in float32, one rounding to the activations' dtype where torch rounds
between ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton_kernels import check_packed, format_code
from engine.attention.triton_quant import quantize_store
from engine.models.row_ops import RowOps, as_rows


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    y_ptr,
    stride_x,
    stride_r,
    stride_y,
    n,
    eps,
    ADD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # one program per row; ADD: residual += x first, then normalise the new residual
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if ADD:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(r.dtype)
        tl.store(res_ptr + row * stride_r + offs, x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / n + eps)
    # as the reference (engine/models/row_ops.py, transformers' rounding): x * inv in float32,
    # rounded to x's dtype, then times the weight
    scaled = (xf * inv).to(x.dtype)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    y = scaled.to(tl.float32) * w.to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_kernel(gu_ptr, y_ptr, stride_gu, stride_y, inter, BLOCK: tl.constexpr):
    # program (row, column tile): y[row, c] = silu(gate[row, c]) * up[row, c]
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    g = tl.load(gu_ptr + row * stride_gu + offs, mask=mask, other=0.0)
    u = tl.load(gu_ptr + row * stride_gu + inter + offs, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
    y = s.to(tl.float32) * u.to(tl.float32)
    tl.store(y_ptr + row * stride_y + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_store_kv_kernel(
    qk_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_qt,
    stride_qh,
    stride_vt,
    stride_vh,
    stride_cos,
    stride_sin,
    stride_ot,
    stride_oh,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,  # rotary dims / 2: dims [0, 2 * HALF) rotate, the rest pass through
    BLOCK_D: tl.constexpr,
    FORMAT: tl.constexpr,  # KVFormat.code of a quantized pool; -1: the model's dtype
    QMAX: tl.constexpr,
):
    # program (token t, head h of q then k): rotate-half rope of the head; a k head is also
    # stored at the token's slot, with the v head of the same index (quantized: the roped k as
    # rounded to the activations' dtype, as the reference quantizes it)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    x_row = qk_ptr + t * stride_qt + h * stride_qh
    x = tl.load(x_row + d, mask=d_mask, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + t * stride_cos + d, mask=d_mask, other=0.0).to(tl.float32)
    first, second = d < HALF, (d >= HALF) & (d < 2 * HALF)
    partner = tl.where(first, d + HALF, d - HALF)
    rotating = first | second
    x2 = tl.load(x_row + partner, mask=rotating, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + t * stride_sin + d % HALF, mask=rotating, other=0.0).to(tl.float32)
    out = x * cos + tl.where(first, -x2, x2) * sin
    out = out.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, out, mask=d_mask)
    if h >= NUM_Q_HEADS:
        kvh = h - NUM_Q_HEADS
        slot = tl.load(slot_ptr + t).to(tl.int64)
        v = tl.load(v_ptr + t * stride_vt + kvh * stride_vh + d, mask=d_mask, other=0.0)
        if FORMAT < 0:
            at = slot * (NUM_KV_HEADS * HEAD_DIM) + kvh * HEAD_DIM + d
            tl.store(k_cache_ptr + at, out, mask=d_mask)
            tl.store(v_cache_ptr + at, v, mask=d_mask)
        else:  # one packed row each, as rows [1, BLOCK_D]
            packed = HEAD_DIM + 4
            row = tl.full([1], 0, tl.int64) + slot * (NUM_KV_HEADS * packed) + kvh * packed
            one = tl.full([1], 1, tl.int1)
            k_row = out.to(tl.float32)[None, :]
            quantize_store(k_cache_ptr, row, one, d, k_row, FORMAT, QMAX, HEAD_DIM)
            v_row = v.to(tl.float32)[None, :]
            quantize_store(v_cache_ptr, row, one, d, v_row, FORMAT, QMAX, HEAD_DIM)


class TritonRowOps(RowOps):
    """The fused row ops on CUDA (engine/models/row_ops.py's interface)."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x [..., n] -> x * rsqrt(mean(x^2) + eps) * weight (float32 statistics)."""
        rows = as_rows(x)
        y = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
        self._norm(rows, rows, weight, y, eps, add=False)
        return y.view(x.shape)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """residual [T, n] += x (in place); (rms_norm(residual), residual)."""
        if residual.stride(-1) != 1 or residual.dim() != 2:
            raise ValueError("add_rms_norm needs a [T, n] residual with unit stride along n")
        rows = as_rows(x)
        y = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
        self._norm(rows, residual, weight, y, eps, add=True)
        return y, residual

    @staticmethod
    def _norm(x, residual, weight, y, eps: float, add: bool) -> None:
        num_rows, n = y.shape
        if num_rows == 0:
            return
        _rms_norm_kernel[(num_rows,)](
            x,
            residual,
            weight,
            y,
            x.stride(0),
            residual.stride(0),
            y.stride(0),
            n,
            eps,
            ADD=add,
            BLOCK=triton.next_power_of_2(n),
        )

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2I] -> silu(gate_up[:, :I]) * gate_up[:, I:] as [T, I]."""
        gu = as_rows(gate_up)
        num_rows, inter = gu.shape[0], gu.shape[1] // 2
        y = torch.empty(num_rows, inter, dtype=gu.dtype, device=gu.device)
        if num_rows == 0:
            return y
        block = min(1024, triton.next_power_of_2(inter))
        grid = (num_rows, triton.cdiv(inter, block))
        _silu_mul_kernel[grid](gu, y, gu.stride(0), y.stride(0), inter, BLOCK=block)
        return y

    def rope_store_kv(
        self,
        qk: torch.Tensor,  # [T, Hq + Hkv, D] (any row stride; heads of D contiguous values)
        v: torch.Tensor,  # [T, Hkv, D]
        cos: torch.Tensor,  # [T, 1, D]: [cos, cos, 1...] (engine/models/rope.py)
        sin: torch.Tensor,  # [T, 1, rotary_dim / 2]
        k_cache: torch.Tensor,  # [num_blocks, bs, Hkv, D] (uint8 [.., D + 4] packed), contiguous
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,  # int64 [T]
    ) -> torch.Tensor:
        """Rope of qk's q and k heads -> a new contiguous [T, Hq + Hkv, D]; the roped k heads and
        v are written to the caches at slot_mapping (the attention must not store them again),
        quantized where the row ops have a kv_format."""
        t, heads, d = qk.shape
        hkv = v.shape[1]
        check_packed(d, self.kv_format)
        if qk.stride(2) != 1 or v.stride(2) != 1:
            qk, v = qk.contiguous(), v.contiguous()
        out = torch.empty((t, heads, d), dtype=qk.dtype, device=qk.device)
        if t == 0:
            return out
        cos2, sin2 = cos.reshape(t, -1), sin.reshape(t, -1)
        _rope_store_kv_kernel[(t, heads)](
            qk,
            v,
            cos2,
            sin2,
            out,
            k_cache,
            v_cache,
            slot_mapping,
            qk.stride(0),
            qk.stride(1),
            v.stride(0),
            v.stride(1),
            cos2.stride(0),
            sin2.stride(0),
            out.stride(0),
            out.stride(1),
            NUM_Q_HEADS=heads - hkv,
            NUM_KV_HEADS=hkv,
            HEAD_DIM=d,
            HALF=sin2.shape[1],
            BLOCK_D=triton.next_power_of_2(d),
            FORMAT=format_code(self.kv_format),
            QMAX=self.kv_format.qmax if self.kv_format else 0.0,
        )
        return out
