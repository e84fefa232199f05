"""A decoder layer's row-wise ops behind one interface, so CPU and CUDA share the layer code.

RowOps computes them with torch ops: the reference every fused implementation is tested against,
and the fallback. NativeRowOps runs them as single native CPU ops (engine/attention/csrc/row_ops.cpp);
on CUDA the triton kernels of engine/attention/triton_row_ops.py implement the same methods.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.native import NativeKernels, load_native
from engine.attention.torch_backend import write_kv
from engine.kv.quant import KVFormat, store_quantized
from engine.models.rope import apply_rope


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dim, as transformers computes it: in
    float32, rounded to x's dtype before the weight multiply."""
    x32 = x.float()
    normed = x32 * x32.square().mean(-1, keepdim=True).add_(eps).rsqrt_()
    return weight * normed.to(x.dtype)


class RowOps:
    """The torch reference of the row-wise ops. kv_format: the caches hold quantized rows
    (engine/kv/quant.py): rope_store_kv quantizes what it stores."""

    def __init__(self, kv_format: KVFormat | None = None) -> None:
        self.kv_format = kv_format

    @staticmethod
    def for_device(device: torch.device, kv_format: KVFormat | None = None) -> RowOps:
        """The triton kernels on CUDA; the native ops on CPU where they build; else torch's."""
        if device.type == "cuda":
            from engine.attention.triton_row_ops import TritonRowOps

            return TritonRowOps(kv_format)
        native = load_native() if device.type == "cpu" else None
        return NativeRowOps(native, kv_format) if native is not None else RowOps(kv_format)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x [..., n] -> RMSNorm(x) * weight (float32 statistics)."""
        return rms_norm(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(residual + x), residual + x); x, residual [T, n]. The sum may be written
        into residual in place: the caller reads the returned one."""
        residual = residual + x
        return rms_norm(residual, weight, eps), residual

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2I] -> silu(gate_up[:, :I]) * gate_up[:, I:] as [T, I]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def rope_store_kv(
        self,
        qk: torch.Tensor,  # [T, Hq + Hkv, D] (any token stride; heads of D contiguous values)
        v: torch.Tensor,  # [T, Hkv, D]
        cos: torch.Tensor,  # [T, 1, D]: [cos, cos, 1...] (engine/models/rope.py)
        sin: torch.Tensor,  # [T, 1, rotary_dim / 2]
        k_cache: torch.Tensor,  # [num_blocks, bs, Hkv, D]
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,  # int64 [T]
    ) -> torch.Tensor:
        """Rope of qk's q and k heads -> a new contiguous [T, Hq + Hkv, D]; the roped k heads and
        v are written to the caches at slot_mapping (the attention must not store them again)."""
        out = apply_rope(qk, cos, sin)
        k = out[:, out.shape[1] - v.shape[1] :]
        if self.kv_format is None:
            write_kv(k, v, k_cache, v_cache, slot_mapping)
        else:
            store_quantized(k, v, k_cache, v_cache, slot_mapping, self.kv_format)
        return out


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, n] with unit stride along n (a view where it already is)."""
    if x.dim() == 2 and x.stride(1) == 1:
        return x
    flat = x.reshape(-1, x.shape[-1])
    return flat if flat.stride(1) == 1 else flat.contiguous()


class NativeRowOps(RowOps):
    """The row-wise ops as single native CPU ops (one dispatch each instead of a chain)."""

    def __init__(self, native: NativeKernels, kv_format: KVFormat | None = None) -> None:
        super().__init__(kv_format)
        self.native = native

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self.native.rms_norm(as_rows(x), weight, eps).view(x.shape)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.native.add_rms_norm(x, residual, weight, eps), residual

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.native.silu_mul(gate_up)

    def rope_store_kv(
        self,
        qk: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        if self.kv_format is not None:
            return self.native.rope_store_kv_q(
                qk, v, cos, sin, k_cache, v_cache, slot_mapping, self.kv_format
            )
        return self.native.rope_store_kv(qk, v, cos, sin, k_cache, v_cache, slot_mapping)
