"""Quantized KV formats (engine/kv/quant.py): the codes and scales, the pool's packed rows and
budget, and torch's dequantizing reference attention against a dense one."""

from __future__ import annotations

import pytest
import torch

from engine.attention import build_attention_metadata
from engine.attention.quant_reference import DequantizingAttention
from engine.config import EngineConfig
from engine.kv.paged_cache import KVCache, bytes_per_block
from engine.kv.quant import (
    FP8_E4M3,
    FP8_E5M2,
    INT8,
    KV_FORMATS,
    dequantize,
    kv_format,
    quantize,
    store_quantized,
)
from tests.engine.test_attention import CASES, dense_reference, make_batch

FORMATS = list(KV_FORMATS.values())
IDS = list(KV_FORMATS)
# the largest error of a dequantized value, as a share of its row's amax: int8 half a step of
# amax / 127; fp8 half an ulp at the top binade (3 / 2 mantissa bits) relative to the value
REL_ERROR = {INT8.name: 0.5 / 127, FP8_E4M3.name: 2**-4, FP8_E5M2.name: 2**-3}


def rows(seed: int = 0, n: int = 64, d: int = 64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, d, generator=gen) * torch.rand(n, 3, 1, generator=gen) * 10
    x[0, 0] = 0  # an all-zero row
    x[1, 1, 5] = 1e4  # an outlier sets its row's scale
    return x


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_codes_and_scale_round_trip_within_the_format_error(fmt) -> None:
    x = rows()
    packed = quantize(x, fmt)
    assert packed.dtype == torch.uint8 and packed.shape == (*x.shape[:-1], x.shape[-1] + 4)
    back = dequantize(packed, fmt)
    amax = x.abs().amax(-1, keepdim=True)
    if fmt is INT8:
        assert ((back - x).abs() <= REL_ERROR[fmt.name] * amax * (1 + 1e-6)).all()
    else:  # relative to the value where it is a normal number of the format
        normal = x.abs() > amax * 2**-6
        err = ((back - x).abs() / x.abs().clamp_min(1e-30))[normal]
        assert (err <= REL_ERROR[fmt.name] * (1 + 1e-6)).all()
    assert (back[0, 0] == 0).all()
    # each row's amax maps to the largest code: its scale is amax / qmax
    scale = packed[..., -4:].contiguous().view(torch.float32).squeeze(-1)
    torch.testing.assert_close(scale[1, 1], amax[1, 1, 0] / fmt.qmax)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_a_row_is_quantized_alone(fmt) -> None:
    """A row's bytes depend on that row only: whatever else is quantized with it, or when."""
    x = rows(1)
    whole = quantize(x, fmt)
    for i in (0, 7, 63):
        assert torch.equal(quantize(x[i : i + 1], fmt)[0], whole[i])
    assert torch.equal(quantize(x.bfloat16(), fmt), quantize(x.bfloat16().float(), fmt))


def test_int8_rounds_half_to_even() -> None:
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5]])  # scale 1: codes are x rounded
    codes = quantize(x, INT8)[0, :6].view(torch.int8).tolist()
    assert codes == [127, 0, 2, 2, 0, -2]


def test_formats_and_the_flag() -> None:
    assert kv_format("auto") is None and kv_format("fp8_e5m2") is FP8_E5M2
    with pytest.raises(ValueError, match="kv cache dtype must be one of"):
        kv_format("fp8")
    with pytest.raises(ValueError, match="kv cache dtype"):
        EngineConfig(kv_cache_dtype="int4")


@pytest.mark.parametrize("head_dim,ratio", [(64, 128 / 68), (256, 512 / 260)])
def test_the_same_memory_holds_more_blocks(head_dim: int, ratio: float) -> None:
    plain = bytes_per_block(30, 16, 3, head_dim, torch.bfloat16)
    packed = bytes_per_block(30, 16, 3, head_dim, torch.bfloat16, INT8)
    assert plain / packed == pytest.approx(ratio)
    budget = 64 * plain
    pool = KVCache.from_budget(2, 16, 3, head_dim, torch.bfloat16, memory_bytes=budget)
    small = KVCache.from_budget(
        2, 16, 3, head_dim, torch.bfloat16, memory_bytes=budget, kv_format=INT8
    )
    assert small.num_blocks == int(pool.num_blocks * ratio)
    assert small.tensor.dtype == torch.uint8 and small.tensor.shape[-1] == head_dim + 4
    assert small.nbytes <= budget


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("case", CASES[:6], ids=[f"case{i}" for i in range(6)])
def test_reference_attention_reads_the_stored_rows(case, window, fmt) -> None:
    query_lens, prefix_lens, bs, hq, hkv, d, groups = case
    q, k, v, k_cache, v_cache, tables, full_k, full_v = make_batch(
        0, query_lens, prefix_lens, bs, hq, hkv, d, groups
    )
    packed_k, packed_v = quantize(k_cache, fmt), quantize(v_cache, fmt)
    seq_lens = [a + b for a, b in zip(query_lens, prefix_lens, strict=True)]
    meta = build_attention_metadata(query_lens, seq_lens, tables, bs)
    backend = DequantizingAttention(fmt)
    out = backend.forward(q, k, v, packed_k, packed_v, backend.plan(meta), d**-0.5, window)
    # the reference: every key and value as stored, the new tokens' included
    new_k, new_v = dequantize(quantize(k, fmt), fmt), dequantize(quantize(v, fmt), fmt)
    start = 0
    for i, qlen in enumerate(query_lens):
        plen = prefix_lens[i]
        full_k[i] = torch.cat(
            [dequantize(quantize(full_k[i][:plen], fmt), fmt), new_k[start : start + qlen]]
        )
        full_v[i] = torch.cat(
            [dequantize(quantize(full_v[i][:plen], fmt), fmt), new_v[start : start + qlen]]
        )
        start += qlen
    ref = dense_reference(q, full_k, full_v, query_lens, d**-0.5, window)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    # the new rows landed quantized at their slots
    stored = packed_k.view(-1, hkv, d + 4).index_select(0, meta.slot_mapping)
    assert torch.equal(stored, quantize(k, fmt))


def test_store_quantized_writes_whole_rows_at_slots() -> None:
    k, v = rows(2, n=6, d=16), rows(3, n=6, d=16)
    k_cache = torch.zeros(4, 4, 3, 20, dtype=torch.uint8)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([15, 0, 7, 8, 3, 12])
    store_quantized(k, v, k_cache, v_cache, slots, FP8_E4M3)
    assert torch.equal(k_cache.view(16, 3, 20)[slots], quantize(k, FP8_E4M3))
    assert torch.equal(v_cache.view(16, 3, 20)[slots], quantize(v, FP8_E4M3))
    untouched = sorted(set(range(16)) - set(slots.tolist()))
    assert not k_cache.view(16, 3, 20)[untouched].any()


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8_e4m3"])
def test_the_namespace_names_the_format(make_llm, kv_dtype: str) -> None:
    """Blocks of different formats never share a cache entry: the namespace (which seeds every
    block hash and tier key) carries the format."""
    plain, quantized = make_llm(), make_llm(kv_cache_dtype=kv_dtype)
    assert quantized.engine.namespace.kv_dtype == kv_dtype
    assert plain.engine.namespace.hex != quantized.engine.namespace.hex
