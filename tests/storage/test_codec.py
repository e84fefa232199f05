from __future__ import annotations

import pytest
import torch

from storage.codec import (
    FORMAT_VERSION,
    HEADER_SIZE,
    CorruptBlock,
    decode_block,
    encode_block,
    read_header,
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
