from __future__ import annotations

import pytest
import torch

from storage.codec import (
    FORMAT_VERSION,
    HEADER_SIZE,
    PACKED_CODES,
    CorruptBlock,
    decode_block,
    encode_block,
    read_header,
    stored_format,
    verify_block,
)
from tests.storage.blocks import BLOCK_SHAPE, make_block


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip(dtype: torch.dtype) -> None:
    kv = make_block(1, dtype)
    data = encode_block(kv)
    assert len(data) == HEADER_SIZE + kv.numel() * kv.element_size()
    out = decode_block(data, dtype, BLOCK_SHAPE)
    assert out.dtype == dtype and out.shape == kv.shape
    assert torch.equal(out.view(torch.uint8), kv.view(torch.uint8))  # bit exact


def test_round_trip_of_a_pool_view() -> None:
    # kv_cache[:, :, block_id] is a non-contiguous view of the pool
    pool = torch.randn(2, 2, 5, 4, 2, 8).to(torch.bfloat16)
    view = pool[:, :, 3]
    assert not view.is_contiguous()
    assert torch.equal(decode_block(encode_block(view)), view)


def test_decoded_tensor_shares_the_buffer() -> None:
    data = bytearray(encode_block(make_block(2)))
    out = decode_block(data)
    data[-1] ^= 0xFF
    assert out.view(torch.uint8).view(-1)[-1] == data[-1]


def test_flipped_payload_byte_is_rejected() -> None:
    data = bytearray(encode_block(make_block(3)))
    data[HEADER_SIZE + 17] ^= 0x01
    with pytest.raises(CorruptBlock, match="checksum"):
        decode_block(bytes(data))
    read_header(data)  # header itself is fine
    decode_block(bytes(data), verify=False)  # only the checksum catches it


@pytest.mark.parametrize("keep", [0, 10, HEADER_SIZE, HEADER_SIZE + 100])
def test_truncation_is_rejected(keep: int) -> None:
    data = encode_block(make_block(4))
    with pytest.raises(CorruptBlock):
        verify_block(data[:keep])


def test_trailing_bytes_are_rejected() -> None:
    with pytest.raises(CorruptBlock, match="payload bytes"):
        verify_block(encode_block(make_block(4)) + b"x")


def test_wrong_magic_and_version_are_rejected() -> None:
    data = bytearray(encode_block(make_block(5)))
    bad_magic = b"XXXX" + data[4:]
    with pytest.raises(CorruptBlock, match="magic"):
        decode_block(bytes(bad_magic))
    data[4:6] = (FORMAT_VERSION + 1).to_bytes(2, "little")
    with pytest.raises(CorruptBlock, match="version"):
        decode_block(bytes(data))


def test_mismatched_dtype_or_shape_is_rejected() -> None:
    data = encode_block(make_block(6, torch.float32))
    with pytest.raises(CorruptBlock, match="dtype"):
        decode_block(data, "bfloat16")
    with pytest.raises(CorruptBlock, match="shape"):
        decode_block(data, torch.float32, (2, 2, 4, 2, 4))
    assert decode_block(data, "float32", BLOCK_SHAPE).shape == BLOCK_SHAPE


# --- quantized blocks: uint8 rows of D codes then a float32 scale (engine/kv/quant.py) ---
PACKED_SHAPE = (*BLOCK_SHAPE[:-1], BLOCK_SHAPE[-1] + 4)


def packed_block(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, PACKED_SHAPE, generator=gen, dtype=torch.uint8)


@pytest.mark.parametrize("fmt", sorted(PACKED_CODES))
def test_packed_round_trip(fmt: str) -> None:
    kv = packed_block(7)
    data = encode_block(kv, fmt)
    assert len(data) == HEADER_SIZE + kv.numel()  # a byte a code, four a row's scale
    header = verify_block(data)
    assert header.format == fmt and header.code == PACKED_CODES[fmt]
    out = decode_block(data, fmt, PACKED_SHAPE)
    assert out.dtype == torch.uint8 and torch.equal(out, kv)  # codes and scales bit for bit


@pytest.mark.parametrize("fmt", sorted(PACKED_CODES))
def test_a_packed_format_is_told_apart_from_every_other(fmt: str) -> None:
    data = encode_block(packed_block(8), fmt)
    for other in [*(n for n in PACKED_CODES if n != fmt), "uint8", torch.uint8, torch.int8]:
        with pytest.raises(CorruptBlock, match="dtype"):
            decode_block(data, other)
    plain = encode_block(packed_block(8))  # untagged uint8 bytes are not a quantized block
    with pytest.raises(CorruptBlock, match="dtype"):
        decode_block(plain, fmt)
    with pytest.raises(CorruptBlock, match="dtype"):
        decode_block(encode_block(make_block(8)), fmt)  # nor a bfloat16 block


def test_int8_names_the_packed_format_and_torch_int8_the_plain_tensor() -> None:
    plain = encode_block(torch.zeros(BLOCK_SHAPE, dtype=torch.int8))
    assert decode_block(plain, torch.int8).dtype == torch.int8
    with pytest.raises(CorruptBlock, match="dtype"):
        decode_block(plain, "int8")
    with pytest.raises(ValueError, match="not a block of int8"):
        encode_block(torch.zeros(PACKED_SHAPE, dtype=torch.int8), "int8")  # packed rows: uint8
    with pytest.raises(ValueError, match="not a block of fp8_e4m3"):
        encode_block(make_block(9), "fp8_e4m3")  # bfloat16 values must be quantized first


@pytest.mark.parametrize("fmt", sorted(PACKED_CODES))
def test_the_checksum_covers_the_scales(fmt: str) -> None:
    kv = packed_block(10)
    row = 5  # a row's scale: its last four bytes
    offset = HEADER_SIZE + row * PACKED_SHAPE[-1] + BLOCK_SHAPE[-1] + 3  # the scale's top byte
    data = bytearray(encode_block(kv, fmt))
    data[offset] ^= 0x40
    with pytest.raises(CorruptBlock, match="checksum"):
        decode_block(bytes(data), fmt)
    changed = decode_block(bytes(data), fmt, verify=False)
    assert not torch.equal(changed, kv)  # the flipped byte was the scale's, and only it caught it


def test_stored_format_reads_a_namespace_kv_dtype() -> None:
    assert stored_format("bfloat16") == "bfloat16"
    assert stored_format("int8") == "int8"
    assert stored_format("bfloat16@fp8_e5m2") == "fp8_e5m2"
