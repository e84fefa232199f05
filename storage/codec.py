"""Block codec: one block's KV for all layers <-> bytes with a self-checking header.

Layout of a value (little endian), see DESIGN.md "Spill tier format":

    magic      4s   b"RCKV"
    version    u16  FORMAT_VERSION
    dtype      u8   code from DTYPE_CODES
    ndim       u8   number of dimensions (<= MAX_DIMS)
    shape      8 x u32 (unused dimensions are 0)
    length     u64  payload bytes
    checksum   u64  xxh64 of the payload
    payload         the tensor's bytes, C order

A value whose header, length or checksum does not hold raises CorruptBlock; it is never used.
"""

from __future__ import annotations

import math
import struct
import warnings
from dataclasses import dataclass

import torch
import xxhash

MAGIC = b"RCKV"
FORMAT_VERSION = 1
MAX_DIMS = 8
_HEADER = struct.Struct("<4sHBB8IQQ")
HEADER_SIZE = _HEADER.size

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.float64: 4,
    torch.uint8: 5,
    torch.int8: 6,
}
_CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


class CorruptBlock(ValueError):
    """A stored value failed its header, length or checksum check, or does not match what the
    caller expects (dtype / shape). The value must be discarded, never used."""


@dataclass(frozen=True)
class BlockHeader:
    dtype: torch.dtype
    shape: tuple[int, ...]
    payload_len: int
    checksum: int


def dtype_from_name(name: str | torch.dtype) -> torch.dtype:
    """'bfloat16' -> torch.bfloat16 (Namespace.kv_dtype strings); torch dtypes pass through."""
    if isinstance(name, torch.dtype):
        return name
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype) or dtype not in DTYPE_CODES:
        raise ValueError(f"unknown kv dtype {name!r}")
    return dtype


def encode_block(kv: torch.Tensor) -> bytes:
    """kv: [layers, 2, block_size, kv_heads, head_dim] (any shape up to 8 dims) -> header + bytes.

    The tensor is moved to CPU and made contiguous only if needed; the payload is copied once,
    into the returned bytes."""
    if kv.dtype not in DTYPE_CODES:
        raise ValueError(f"unsupported dtype {kv.dtype}")
    if kv.dim() > MAX_DIMS:
        raise ValueError(f"at most {MAX_DIMS} dimensions, got {kv.dim()}")
    kv = kv.detach().to("cpu").contiguous()
    payload = kv.view(-1).view(torch.uint8).numpy()
    shape = list(kv.shape) + [0] * (MAX_DIMS - kv.dim())
    header = _HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        DTYPE_CODES[kv.dtype],
        kv.dim(),
        *shape,
        payload.nbytes,
        xxhash.xxh64_intdigest(payload),
    )
    return b"".join((header, payload.data))


def read_header(data: bytes | bytearray | memoryview) -> BlockHeader:
    """Parse and check the header (not the checksum). Raises CorruptBlock."""
    if len(data) < HEADER_SIZE:
        raise CorruptBlock(f"value of {len(data)} bytes is shorter than the header")
    magic, version, code, ndim, *rest = _HEADER.unpack_from(data)
    shape_all, payload_len, checksum = rest[:MAX_DIMS], rest[MAX_DIMS], rest[MAX_DIMS + 1]
    if magic != MAGIC:
        raise CorruptBlock(f"bad magic {magic!r}")
    if version != FORMAT_VERSION:
        raise CorruptBlock(f"format version {version}, expected {FORMAT_VERSION}")
    if code not in _CODE_DTYPES:
        raise CorruptBlock(f"unknown dtype code {code}")
    if ndim > MAX_DIMS or any(shape_all[ndim:]):
        raise CorruptBlock(f"bad shape header (ndim {ndim})")
    dtype, shape = _CODE_DTYPES[code], tuple(shape_all[:ndim])
    if payload_len != math.prod(shape) * dtype.itemsize:
        raise CorruptBlock(f"payload length {payload_len} does not match {dtype} {shape}")
    if len(data) != HEADER_SIZE + payload_len:
        raise CorruptBlock(
            f"value has {len(data) - HEADER_SIZE} payload bytes, header says {payload_len}"
        )
    return BlockHeader(dtype, shape, payload_len, checksum)


def verify_block(data: bytes | bytearray | memoryview) -> BlockHeader:
    """Check header, length and xxh64 checksum. Raises CorruptBlock."""
    header = read_header(data)
    if xxhash.xxh64_intdigest(memoryview(data)[HEADER_SIZE:]) != header.checksum:
        raise CorruptBlock("checksum mismatch")
    return header


def decode_block(
    data: bytes | bytearray | memoryview,
    dtype: torch.dtype | str | None = None,
    shape: tuple[int, ...] | None = None,
    *,
    verify: bool = True,
) -> torch.Tensor:
    """bytes -> tensor of the stored dtype and shape, sharing memory with `data` (no copy).

    Raises CorruptBlock when the value is damaged or differs from the expected dtype / shape.
    If `data` is immutable (bytes) the tensor must be treated as read-only: copy it into the
    device pool, never write to it. verify=False skips the checksum (header is still checked),
    for callers whose tier already verified the value."""
    header = verify_block(data) if verify else read_header(data)
    if dtype is not None and header.dtype != dtype_from_name(dtype):
        raise CorruptBlock(f"stored dtype {header.dtype}, expected {dtype}")
    if shape is not None and header.shape != tuple(shape):
        raise CorruptBlock(f"stored shape {header.shape}, expected {tuple(shape)}")
    if header.payload_len == 0:
        return torch.empty(header.shape, dtype=header.dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        raw = torch.frombuffer(
            data, dtype=torch.uint8, offset=HEADER_SIZE, count=header.payload_len
        )
    return raw.view(header.dtype).view(header.shape)
