"""Quantized KV formats (--kv-cache-dtype / --tier-kv-dtype int8, fp8_e4m3, fp8_e5m2) and their
torch reference: the native and triton kernels are tested against quantize / dequantize here.

A quantized pool row packs one token's head: its D codes (one byte each), then its float32 scale
(4 bytes, little endian), so a pool of [.., Hkv, D] values becomes [.., Hkv, D + 4] bytes. The
scale is per token and head: amax(|x|) / qmax of that row alone. Per-token scales make a row's
bytes a function of that token's K or V only, whatever the chunking, batching or cache hits that
wrote it, so the cache can never change an answer (both paths read the same bytes); a scale per
block would depend on which of its tokens were written first. Its price is 4 bytes per row: for
head_dim 64, 68 bytes against bf16's 128 (1.88x the tokens per byte), 1.97x at head_dim 256.

Codes: int8 rounds x / scale to nearest even, clamped to +-127; fp8 converts x / scale (clamped
to +-qmax) to torch's float8_e4m3fn / float8_e5m2 with round-to-nearest-even. Dequantized:
code's value * scale, in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCALE_BYTES = 4  # a row's float32 scale, after its codes


@dataclass(frozen=True)
class KVFormat:
    name: str  # the flag's value, and Namespace.kv_dtype of blocks in this format
    code: int  # the native and triton kernels' format argument
    qmax: float  # the largest code value: a row's amax maps to it
    code_dtype: torch.dtype  # what a code byte is, read as a torch dtype

    def packed_dim(self, head_dim: int) -> int:
        return head_dim + SCALE_BYTES


INT8 = KVFormat("int8", 0, 127.0, torch.int8)
FP8_E4M3 = KVFormat("fp8_e4m3", 1, 448.0, torch.float8_e4m3fn)
FP8_E5M2 = KVFormat("fp8_e5m2", 2, 57344.0, torch.float8_e5m2)
KV_FORMATS: dict[str, KVFormat] = {f.name: f for f in (INT8, FP8_E4M3, FP8_E5M2)}


def kv_format(name: str) -> KVFormat | None:
    """'int8' -> INT8; 'auto' (the model's dtype) -> None; a clear error for any other name."""
    if name == "auto":
        return None
    try:
        return KV_FORMATS[name]
    except KeyError:
        choices = ("auto", *KV_FORMATS)
        raise ValueError(f"kv cache dtype must be one of {choices}, got {name!r}") from None


def row_scales(x: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """x [..., D] -> float32 [...]: amax / qmax of each row (1 where a row is all zeros)."""
    amax = x.float().abs().amax(dim=-1)
    scale = amax / fmt.qmax
    return torch.where(amax > 0, scale, torch.ones_like(scale))


def quantize(x: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """x [..., D] (any float dtype) -> uint8 [..., D + 4]: each row's codes, then its scale."""
    scale = row_scales(x, fmt)
    q = (x.float() / scale.unsqueeze(-1)).clamp_(-fmt.qmax, fmt.qmax)
    codes = q.round_().to(torch.int8) if fmt.code_dtype == torch.int8 else q.to(fmt.code_dtype)
    scale_bytes = scale.unsqueeze(-1).view(torch.uint8)  # [..., 4], little endian on x86 / CUDA
    return torch.cat((codes.view(torch.uint8), scale_bytes), dim=-1)


def code_values(codes: torch.Tensor, fmt: KVFormat) -> torch.Tensor:
    """uint8 codes -> their float32 values, exactly. fp8 goes through float16 bits (torch converts
    float8 to float32 one element at a time on CPU, ~5x slower): an e5m2 byte is a half's high
    byte; an e4m3 byte's exponent and mantissa, shifted into a half, read 2^8 too small (its bias is
    7 to the half's 15), normals and subnormals alike (0x7F / 0xFF, e4m3fn's NaNs, read as +-480:
    quantize never writes them)."""
    if fmt.code_dtype == torch.int8:
        return codes.contiguous().view(torch.int8).float()
    wide = codes.to(torch.int16)
    if fmt.code_dtype == torch.float8_e5m2:
        return (wide << 8).view(torch.float16).float()
    bits = ((wide & 0x80) << 8) | ((wide & 0x7F) << 7)
    return bits.view(torch.float16).float() * 256


def dequantize(
    packed: torch.Tensor, fmt: KVFormat, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """uint8 [..., D + 4] -> [..., D] of `dtype`: code value * scale (in float32, then rounded)."""
    scale = packed[..., -SCALE_BYTES:].contiguous().view(torch.float32)  # [..., 1]
    return (code_values(packed[..., :-SCALE_BYTES], fmt) * scale).to(dtype)


def store_quantized(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,
    k_cache: torch.Tensor,  # uint8 [num_blocks, bs, Hkv, D + 4]
    v_cache: torch.Tensor,
    slots: torch.Tensor,  # int64 [T]
    fmt: KVFormat,
) -> None:
    """Quantizes k and v and writes their rows at the flat slots (the torch reference store)."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, quantize(k, fmt))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, quantize(v, fmt))


def pool_row(head_dim: int, dtype: torch.dtype, fmt: KVFormat | None) -> tuple[int, torch.dtype]:
    """The last dimension and dtype of a pool holding one head's K or V per row: the model's
    (head_dim, dtype), or the packed (head_dim + 4, uint8) of a quantized format."""
    if fmt is None:
        return head_dim, dtype
    return fmt.packed_dim(head_dim), torch.uint8
