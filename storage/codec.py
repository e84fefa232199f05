"""Block codec: one block's KV for all layers <-> bytes with a self-checking header.

Layout of a value (little endian), see DESIGN.md "Spill tier format":

    magic      4s   b"RCKV"
    version    u16  FORMAT_VERSION
    dtype      u8   code from DTYPE_CODES, or PACKED_CODES for a quantized block
    ndim       u8   number of dimensions (<= MAX_DIMS)
    shape      8 x u32 (unused dimensions are 0)
    length     u64  payload bytes
    checksum   u64  xxh64 of the payload
    payload         the tensor's bytes, C order

A value whose header, length or checksum does not hold raises CorruptBlock; it is never used.

Quantized blocks (--kv-cache-dtype / --tier-kv-dtype int8, fp8_e4m3, fp8_e5m2) are uint8 rows of
D codes then the row's float32 scale (engine/kv/quant.py has the math; the codec knows only the
names): their header says which format, not plain uint8, and the checksum covers the scales with
the codes. A format name is what a Namespace's kv_dtype says its blocks hold (stored_format):
"int8" is always the packed format here, never torch.int8.
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
# quantized formats of packed uint8 rows, by name (engine/kv/quant.py KV_FORMATS)
PACKED_CODES: dict[str, int] = {"int8": 16, "fp8_e4m3": 17, "fp8_e5m2": 18}
_PACKED_NAMES = {code: name for name, code in PACKED_CODES.items()}


class CorruptBlock(ValueError):
    """A stored value failed its header, length or checksum check, or does not match what the
    caller expects (dtype / shape). The value must be discarded, never used."""


@dataclass(frozen=True)
class BlockHeader:
    dtype: torch.dtype  # the payload's torch dtype (uint8 for a packed format)
    shape: tuple[int, ...]
    payload_len: int
    checksum: int
    code: int  # the dtype field: DTYPE_CODES or PACKED_CODES

    @property
    def format(self) -> str:
        """A packed format's name ("int8"), else the payload's torch dtype ("torch.bfloat16")."""
        return _PACKED_NAMES.get(self.code, str(self.dtype))


def stored_format(kv_dtype: str) -> str:
    """What the blocks of a namespace with this kv_dtype hold: "bfloat16" -> "bfloat16", "int8"
    -> "int8"; "bfloat16@int8" (a bfloat16 pool's blocks converted for the tiers) -> "int8"."""
    return kv_dtype.rpartition("@")[2]


def format_code(kv_format: str | torch.dtype) -> int:
    """The header's code for a format: a packed format's name, a torch dtype or its name."""
    if isinstance(kv_format, str) and kv_format in PACKED_CODES:
        return PACKED_CODES[kv_format]
    dtype = getattr(torch, kv_format, None) if isinstance(kv_format, str) else kv_format
    if not isinstance(dtype, torch.dtype) or dtype not in DTYPE_CODES:
        raise ValueError(f"unknown kv format {kv_format!r}")
    return DTYPE_CODES[dtype]


def encode_block(kv: torch.Tensor, kv_format: str | None = None) -> bytes:
    """kv: [layers, 2, block_size, kv_heads, head_dim] (any shape up to 8 dims) -> header + bytes.
    kv_format: the format the block is in (a Namespace's stored_format), checked against kv;
    a packed one (uint8 rows of codes and scale) is written as such. None: kv's dtype.

    The tensor is moved to CPU and made contiguous only if needed; the payload is copied once,
    into the returned bytes."""
    if kv.dtype not in DTYPE_CODES:
        raise ValueError(f"unsupported dtype {kv.dtype}")
    if kv.dim() > MAX_DIMS:
        raise ValueError(f"at most {MAX_DIMS} dimensions, got {kv.dim()}")
    code = DTYPE_CODES[kv.dtype] if kv_format is None else format_code(kv_format)
    if _CODE_DTYPES.get(code, torch.uint8) != kv.dtype:
        raise ValueError(f"a {kv.dtype} tensor is not a block of {kv_format}")
    kv = kv.detach().to("cpu").contiguous()
    payload = kv.view(-1).view(torch.uint8).numpy()
    shape = list(kv.shape) + [0] * (MAX_DIMS - kv.dim())
    header = _HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        code,
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
    if code not in _CODE_DTYPES and code not in _PACKED_NAMES:
        raise CorruptBlock(f"unknown dtype code {code}")
    if ndim > MAX_DIMS or any(shape_all[ndim:]):
        raise CorruptBlock(f"bad shape header (ndim {ndim})")
    dtype, shape = _CODE_DTYPES.get(code, torch.uint8), tuple(shape_all[:ndim])
    if payload_len != math.prod(shape) * dtype.itemsize:
        raise CorruptBlock(f"payload length {payload_len} does not match {dtype} {shape}")
    if len(data) != HEADER_SIZE + payload_len:
        raise CorruptBlock(
            f"value has {len(data) - HEADER_SIZE} payload bytes, header says {payload_len}"
        )
    return BlockHeader(dtype, shape, payload_len, checksum, code)


def verify_block(data: bytes | bytearray | memoryview) -> BlockHeader:
    """Check header, length and xxh64 checksum. Raises CorruptBlock."""
    header = read_header(data)
    if xxhash.xxh64_intdigest(memoryview(data)[HEADER_SIZE:]) != header.checksum:
        raise CorruptBlock("checksum mismatch")
    return header


def expect_block(
    header: BlockHeader, kv_format: torch.dtype | str | None, shape: tuple[int, ...] | None
) -> None:
    """CorruptBlock unless the block is of `kv_format` and `shape` (None: any)."""
    if kv_format is not None and format_code(kv_format) != header.code:
        raise CorruptBlock(f"stored dtype {header.format}, expected {kv_format}")
    if shape is not None and header.shape != tuple(shape):
        raise CorruptBlock(f"stored shape {header.shape}, expected {tuple(shape)}")


def decode_block(
    data: bytes | bytearray | memoryview,
    kv_format: torch.dtype | str | None = None,
    shape: tuple[int, ...] | None = None,
    *,
    verify: bool = True,
) -> torch.Tensor:
    """bytes -> tensor of the stored dtype and shape, sharing memory with `data` (no copy).
    kv_format: the expected format (a torch dtype, its name or a packed format's name: "int8"
    is the packed one, decoded to its uint8 rows; torch.int8 a plain int8 tensor).

    Raises CorruptBlock when the value is damaged or differs from the expected format / shape.
    If `data` is immutable (bytes) the tensor must be treated as read-only: copy it into the
    device pool, never write to it. verify=False skips the checksum (header is still checked),
    for callers whose tier already verified the value."""
    header = verify_block(data) if verify else read_header(data)
    expect_block(header, kv_format, shape)
    if header.payload_len == 0:
        return torch.empty(header.shape, dtype=header.dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        raw = torch.frombuffer(
            data, dtype=torch.uint8, offset=HEADER_SIZE, count=header.payload_len
        )
    return raw.view(header.dtype).view(header.shape)
