"""Quantized KV rows in triton (the format and its torch reference: engine/kv/quant.py): quantize
rows into codes and scales, store them packed, read a code's value back.

Codes are made and read with integer bit ops, not triton's fp8 casts: the interpreter's float ->
fp8 cast does not round to nearest even, and this way the interpreter runs the code the GPU does,
bit-identical to torch's conversion. FORMAT is KVFormat.code (0 int8, 1 fp8_e4m3, 2 fp8_e5m2).
"""

from __future__ import annotations

import triton
import triton.language as tl

NOT_QUANTIZED = -1  # the kernels' FORMAT for a pool of the model's dtype


@triton.jit
def round_half_even(x):
    """float32 x with |x| < 2^22 -> the nearest integer (ties to even), as float32: adding
    1.5 * 2^23 leaves no fraction bits, so the float32 add rounds as the FPU does (RNE)."""
    return (x + 12582912.0) - 12582912.0


@triton.jit
def _fp8_code(y, MANT: tl.constexpr, BIAS: tl.constexpr, SUB_STEPS: tl.constexpr):
    """float32 y (finite, within the format's range) -> its fp8 byte in an int32, rounded to
    nearest even. SUB_STEPS: 1 / the smallest subnormal (2^(BIAS - 1 + MANT))."""
    bits = y.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    # normal: drop 23 - MANT mantissa bits with RNE (a carry moves into the exponent), rebias
    shift: tl.constexpr = 23 - MANT
    half: tl.constexpr = (1 << (shift - 1)) - 1
    rounded = (mag + half + ((mag >> shift) & 1)) >> shift
    normal = rounded - ((127 - BIAS) << MANT)
    # subnormal (below 2^(1 - BIAS)): a count of the smallest steps; 2^MANT steps is the first
    # normal's code, so a tie rounding up crosses over exactly
    steps = tl.abs(y) * SUB_STEPS
    subnormal = steps < (1 << MANT)
    steps = round_half_even(tl.minimum(steps, 1 << MANT)).to(tl.int32)
    code = tl.where(subnormal, steps, normal)
    return code | ((bits >> 24) & 0x80)


@triton.jit
def quantize_rows(x, FORMAT: tl.constexpr, QMAX: tl.constexpr):
    """x float32 [R, BLOCK_D] (padding columns 0) -> (codes uint8 [R, BLOCK_D], scales float32
    [R]) exactly as engine/kv/quant.py's quantize: true divisions, RNE, clamp to +-QMAX."""
    amax = tl.max(tl.abs(x), 1)
    scale = tl.where(amax > 0, tl.math.div_rn(amax, QMAX), 1.0)
    y = tl.math.div_rn(x, scale[:, None])
    y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
    if FORMAT == 0:
        code = round_half_even(y).to(tl.int32)
    elif FORMAT == 1:
        code = _fp8_code(y, 3, 7, 512.0)
    else:
        code = _fp8_code(y, 2, 15, 65536.0)
    return (code & 0xFF).to(tl.uint8), scale


@triton.jit
def quantize_store(
    cache_ptr,
    rows,  # int64 [R]: each row's byte offset in the uint8 pool
    row_mask,  # [R]
    offs_d,  # [BLOCK_D]
    x,  # float32 [R, BLOCK_D]; padding columns 0
    FORMAT: tl.constexpr,
    QMAX: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Rows x quantized and stored packed: codes at [0, HEAD_DIM), the float32 scale after them
    (4-byte aligned: the wrappers require HEAD_DIM % 4 == 0)."""
    codes, scales = quantize_rows(x, FORMAT, QMAX)
    mask = row_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
    tl.store(cache_ptr + rows[:, None] + offs_d[None, :], codes, mask=mask)
    scale_ptr = (cache_ptr + rows + HEAD_DIM).to(tl.pointer_type(tl.float32))
    tl.store(scale_ptr, scales, mask=row_mask)


@triton.jit
def code_values(c, FORMAT: tl.constexpr):
    """uint8 codes -> their values in float32 (before the row's scale): an int8; an e5m2 byte is
    the high byte of the float16 of the same value; an e4m3fn byte moved into float16's bits is
    its value / 2^8 (exponent bias 15 against 7), subnormals included."""
    if FORMAT == 0:
        v = c.to(tl.int8, bitcast=True).to(tl.float32)
    elif FORMAT == 1:
        c16 = c.to(tl.uint16)
        bits = ((c16 & 0x80) << 8) | ((c16 & 0x7F) << 7)
        v = bits.to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    else:
        v = (c.to(tl.uint16) << 8).to(tl.float16, bitcast=True).to(tl.float32)
    return v


@triton.jit
def load_scales(cache_ptr, rows, mask, HEAD_DIM: tl.constexpr):
    """The float32 scales of the packed rows at byte offsets rows [N] (0 where masked)."""
    scale_ptr = (cache_ptr + rows + HEAD_DIM).to(tl.pointer_type(tl.float32))
    return tl.load(scale_ptr, mask=mask, other=0.0)
